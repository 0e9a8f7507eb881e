#include "core/trace.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace minidl::trace {

namespace {

using Clock = std::chrono::steady_clock;

struct Recorder {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::string path;
  int pid = 0;
  Clock::time_point start;
  double clock_offset_us = 0, clock_uncertainty_us = 0;
  std::vector<nlohmann::json> events;
  int next_tid = 0;
  // Spans whose device interval is not read yet (DeviceTimer), and the device tracks by name.
  std::vector<std::pair<std::string, void*>> device_pending;
  size_t device_collect_at = 0;  // read device_pending when it grows to this size
  std::map<std::string, int> device_tids;
};

// A span's device interval is read in batches: at finish(), and when this many more wait than the last read left
// (a device far behind the host keeps some unread; they are not polled again at every span).
constexpr size_t kDeviceBatch = 256;

Recorder& recorder() {
  static Recorder r;
  return r;
}

// Installed once, when the device backend registers (before any span); atomics all the same, for a reinstall.
std::atomic<void (*)(const char*)> range_push{nullptr};
std::atomic<void (*)()> range_pop{nullptr};
DeviceTimer device_timer;  // set before tracing starts
thread_local bool t_device_timed = true;

// This thread's track id, named on first use ("thread N" unless name_thread named it).
thread_local int t_tid = -1;
thread_local std::string t_name;

int tid_locked(Recorder& r) {
  if (t_tid < 0) {
    t_tid = r.next_tid++;
    r.events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", r.pid},
                        {"tid", t_tid},
                        {"args", {{"name", t_name.empty() ? "thread " + std::to_string(t_tid) : t_name}}}});
  }
  return t_tid;
}

int device_tid_locked(Recorder& r, const std::string& track) {
  auto [it, added] = r.device_tids.try_emplace(track, r.next_tid);
  if (added)
    r.events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", r.pid}, {"tid", r.next_tid++}, {"args", {{"name", track}}}});
  return it->second;
}

// Moves the read device intervals from device_pending into events; the rest stay (all are read if `wait`).
void collect_locked(Recorder& r, bool wait) {
  if (r.device_pending.empty()) return;
  size_t kept = 0;
  for (auto& [name, mark] : r.device_pending) {
    double start_us = 0, end_us = 0;
    const char* track = nullptr;
    if (!device_timer.read(mark, wait, &start_us, &end_us, &track)) {
      r.device_pending[kept++] = {std::move(name), mark};
      continue;
    }
    r.events.push_back({{"name", std::move(name)},
                        {"ph", "X"},
                        {"ts", start_us},
                        {"dur", end_us - start_us},
                        {"pid", r.pid},
                        {"tid", device_tid_locked(r, track)}});
  }
  r.device_pending.resize(kept);
  r.device_collect_at = kept + kDeviceBatch;
}

}  // namespace

bool enabled() { return recorder().on.load(std::memory_order_relaxed); }

double now_us() { return std::chrono::duration<double, std::micro>(Clock::now() - recorder().start).count(); }

void set_clock_offset(double offset_us, double uncertainty_us) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.clock_offset_us = offset_us;
  r.clock_uncertainty_us = uncertainty_us;
}

void start(const std::string& path, int pid) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.path = path;
  r.pid = pid;
  r.start = Clock::now();
  r.clock_offset_us = r.clock_uncertainty_us = 0;
  r.events.clear();
  r.device_tids.clear();
  r.device_collect_at = kDeviceBatch;
  if (device_timer.restart) device_timer.restart();
  r.events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(pid)}}}});
  r.on = true;
}

std::string finish() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.on.exchange(false)) return "";
  collect_locked(r, /*wait=*/true);
  std::error_code ignored;  // every rank creates the directory at once
  std::filesystem::create_directories(std::filesystem::path(r.path).parent_path(), ignored);
  const std::string tmp = r.path + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    MINIDL_CHECK(f != nullptr, "--trace: cannot write ", tmp);
    // The start on the host's monotonic clock too: ranks on one host share it, so a test can check the measured
    // offset against the truth (rank r's offset is its start minus rank 0's).
    const double steady_start_us =
        double(std::chrono::duration_cast<std::chrono::microseconds>(r.start.time_since_epoch()).count());
    const nlohmann::json clock{{"clock_offset_us", r.clock_offset_us},
                               {"clock_uncertainty_us", r.clock_uncertainty_us},
                               {"steady_start_us", steady_start_us}};
    const std::string text =
        nlohmann::json{{"traceEvents", r.events}, {"displayTimeUnit", "ms"}, {"otherData", clock}}.dump();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  std::filesystem::rename(tmp, r.path);
  r.events.clear();
  return r.path;
}

void name_thread(const std::string& name) { t_name = name; }

void set_range_hooks(RangeHooks hooks) {
  range_push = hooks.push;
  range_pop = hooks.pop;
}

void set_device_timer(DeviceTimer timer) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  MINIDL_CHECK(!r.on, "trace: the device timer is set before tracing starts");
  device_timer = timer;
}

void set_device_timing(bool on) { t_device_timed = on; }

void collect_device_spans(bool wait) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.on) collect_locked(r, wait);
}

Span::Span(const char* name) {
  if (!enabled()) return;
  name_ = name;
  begin();
}

Span::Span(std::string name) {
  if (!enabled()) return;
  name_ = std::move(name);
  begin();
}

void Span::begin() {
  if (auto push = range_push.load(std::memory_order_relaxed)) {
    push(name_.c_str());
    pushed_ = true;
  }
  if (device_timer.begin) mark_ = device_timer.begin(t_device_timed);
  start_us_ = now_us();
}

Span::~Span() {
  if (pushed_)
    if (auto pop = range_pop.load(std::memory_order_relaxed)) pop();
  if (start_us_ < 0) return;
  const double end = now_us();
  if (mark_) device_timer.end(mark_);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.on) {  // finished while this span was open: nothing to record, only the mark to give back
    double ignored_start = 0, ignored_end = 0;
    const char* ignored_track = nullptr;
    if (mark_) device_timer.read(mark_, /*wait=*/true, &ignored_start, &ignored_end, &ignored_track);
    return;
  }
  if (mark_) {
    r.device_pending.emplace_back(name_, mark_);
    if (r.device_pending.size() >= r.device_collect_at) collect_locked(r, /*wait=*/false);
  }
  r.events.push_back({{"name", name_},
                      {"ph", "X"},
                      {"ts", start_us_},
                      {"dur", end - start_us_},
                      {"pid", r.pid},
                      {"tid", tid_locked(r)}});
}

void counter(const std::string& name, std::initializer_list<std::pair<const char*, double>> values) {
  if (!enabled()) return;
  nlohmann::json args = nlohmann::json::object();
  for (const auto& [k, v] : values) args[k] = v;
  const double ts = now_us();
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.push_back({{"name", name}, {"ph", "C"}, {"ts", ts}, {"pid", r.pid}, {"tid", tid_locked(r)}, {"args", args}});
}

}  // namespace minidl::trace
