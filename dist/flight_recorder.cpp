#include "dist/flight_recorder.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "dist/process_group.h"

namespace fs = std::filesystem;

namespace minidl::dist {

const char* state_name(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::State::kEnqueued: return "enqueued";
    case FlightEntry::State::kCompleted: return "completed";
    case FlightEntry::State::kFailed: return "failed";
    case FlightEntry::State::kDropped: return "dropped";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

bool is_p2p(const std::string& op) { return op == "send" || op == "recv"; }

thread_local std::string t_site;  // CallSite's label for this thread's calls

// The process's recorder: the ring, the calls not yet completed, and per group the last sequence number called and
// completed (what the progress file tells the other ranks).
struct Recorder {
  std::mutex mu;
  const Clock::time_point start = Clock::now();
  size_t capacity = 2000;
  std::deque<FlightEntry> ring;
  int64_t first_id = 0, next_id = 0;              // ring.front() is entry first_id
  std::unordered_map<int64_t, FlightEntry> open;  // enqueued, by id (kept when the ring drops them)
  // Collectives and point-to-point calls count apart: every rank of a group makes the same collectives, in the
  // same order, but not the same sends and receives.
  struct Group {
    std::vector<int> world_ranks;
    int64_t called = 0, completed = 0, p2p_called = 0, p2p_completed = 0;
  };
  std::map<std::string, Group> groups;

  double now_s() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

// The live asynchronous error sources (AsyncErrorWatch). The watchdog polls them holding `mu`, which their
// destructors take too: a source is never polled once its destructor has returned.
struct Watched {
  std::mutex mu;
  std::vector<const AsyncErrorWatch*> watches;
};

Watched& watched() {
  static Watched w;
  return w;
}

nlohmann::json entry_json(const FlightEntry& e) {
  return {{"group", e.group},
          {"seq", e.seq},
          {"site", e.site},
          {"op", e.op},
          {"dtype", std::string(dtype_name(e.dtype))},
          {"count", e.count},
          {"peer", e.peer},
          {"reduce_op", e.reduce_op},
          {"enqueued_s", e.enqueued_s},
          {"completed_s", e.completed_s},
          {"state", state_name(e.state)}};
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  fs::rename(tmp, path);
}

double wall_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// ---- the watchdog ----

struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread, monitor;
  bool stop = false;
  // The watchdog's own heartbeat (each poll), which the monitor thread checks: a watchdog stuck in a file system or
  // a backend's error query must not leave the job unwatched.
  std::atomic<int64_t> heartbeat{0};
  std::mutex monitor_mu;
  std::condition_variable monitor_cv;
  bool monitor_stop = false;
  WatchdogOptions options;
  int rank = 0, world_size = 1;
  nlohmann::json verdict;  // set when this rank's watchdog fired: the call and the ranks it named

  std::string path(const char* kind, int r) const {
    return (fs::path(options.debug_dir) / (std::string(kind) + "-rank" + std::to_string(r) + ".json")).string();
  }

  void write_progress() {
    Recorder& rec = recorder();
    nlohmann::json groups = nlohmann::json::object();
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      for (const auto& [label, g] : rec.groups)
        groups[label] = {{"ranks", g.world_ranks},
                         {"called", g.called},
                         {"completed", g.completed},
                         {"p2p_called", g.p2p_called},
                         {"p2p_completed", g.p2p_completed}};
    }
    const nlohmann::json j = {{"rank", rank}, {"pid", int(::getpid())}, {"time", wall_s()}, {"groups", groups}};
    try {
      write_atomically(path("progress", rank), j.dump());
    } catch (const std::exception&) {
      // A debug directory that went away must not end a healthy run; the timeout message says what is missing.
    }
  }

  // The ranks of `e`'s group that have not called it, with why we think so, from their progress files.
  std::string missing_ranks(const FlightEntry& e, const std::vector<int>& world_ranks, std::vector<int>& named) const {
    const bool p2p = is_p2p(e.op);
    std::string out;
    for (size_t i = 0; i < world_ranks.size(); ++i) {
      const int r = world_ranks[i];
      if (r == rank || (p2p && int(i) != e.peer)) continue;  // a send or receive waits for its peer only
      std::string why;
      try {
        std::ifstream in(path("progress", r));
        if (!in) {
          why = "no progress file";
        } else {
          const nlohmann::json p = nlohmann::json::parse(in);
          const auto& g = p.at("groups");
          const int64_t called = g.contains(e.group) ? g.at(e.group).at("called").get<int64_t>() : 0;
          // Every live rank's watchdog rewrites its file each second: an older one is a rank that stopped running.
          const double silent = wall_s() - p.at("time").get<double>();
          const std::string quiet = silent > 2.5 ? ", silent for " + std::to_string(int(silent)) + " s" : "";
          if (!p2p && called < e.seq)
            why = "has not called it: last called sequence " + std::to_string(called) + quiet;
          else if (!quiet.empty())
            why = "called it, then stopped running" + quiet;
        }
      } catch (const std::exception& x) { why = std::string("unreadable progress file: ") + x.what(); }
      if (why.empty()) continue;
      named.push_back(r);
      if (!out.empty()) out += "; ";
      out += std::to_string(r);
      out += " (" + why + ")";
    }
    return out.empty() ? "none known (every rank's progress file shows the call: a rank is stuck inside it)" : out;
  }

  // This rank's recorder in the debug directory: its path, or why it could not be written.
  std::string write_dump() {
    try {
      return dump_flight_recorder(path("flight", rank));
    } catch (const std::exception& x) { return std::string("(could not be written: ") + x.what() + ")"; }
  }

  // A backend's asynchronous error ends the job as a timeout does, with the error's name.
  [[noreturn]] void fail(const std::string& group, const std::string& error) {
    verdict = {{"group", group}, {"async_error", error}};
    const std::string dump = write_dump();
    std::fprintf(stderr,
                 "minidl: asynchronous communication error on rank %d: group %s: %s; flight recorder: %s; "
                 "ending the job with exit code %d\n",
                 rank, group.c_str(), error.c_str(), dump.c_str(), kCollectiveTimeoutExit);
    std::fflush(stderr);
    abort_job();
  }

  [[noreturn]] void abort_job() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, kCollectiveTimeoutExit);
    std::_Exit(kCollectiveTimeoutExit);
  }

  [[noreturn]] void expire(const FlightEntry& e) {
    std::vector<int> world_ranks;
    {
      std::lock_guard<std::mutex> lock(recorder().mu);
      world_ranks = recorder().groups[e.group].world_ranks;
    }
    // The peers' files are up to a second old: show ours fresh, give theirs a moment to refresh (their watchdogs
    // keep writing, or wrote on expiring too), then read them.
    write_progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    std::vector<int> named;
    const std::string missing = missing_ranks(e, world_ranks, named);
    verdict = {{"group", e.group}, {"seq", e.seq}, {"op", e.op}, {"named_ranks", named}};
    const std::string dump = write_dump();
    std::string ranks;
    for (int r : world_ranks) {
      if (!ranks.empty()) ranks += ",";
      ranks += std::to_string(r);
    }
    std::fprintf(stderr,
                 "minidl: collective timeout on rank %d: group %s (ranks %s) sequence %lld %s %s x %lld%s%s has not "
                 "completed after %.1f s; ranks not joined: %s; flight recorder: %s (every rank's: "
                 "scripts/flight_recorder.py %s); ending the job with exit code %d\n",
                 rank, e.group.c_str(), ranks.c_str(), (long long)e.seq, e.op.c_str(), dtype_name(e.dtype),
                 (long long)e.count, e.reduce_op.empty() ? "" : (" (" + e.reduce_op + ")").c_str(),
                 e.peer >= 0 ? (" peer " + std::to_string(e.peer)).c_str() : "", options.timeout_s, missing.c_str(),
                 dump.c_str(), options.debug_dir.c_str(), kCollectiveTimeoutExit);
    std::fflush(stderr);
    // The other ranks that can still run time out on the same call at about the same moment: give them a moment
    // to write their dumps before the abort takes the job down.
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    abort_job();
  }

  void run() {
    auto last_progress = Clock::now() - std::chrono::seconds(10);
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (stop) break;
      ++heartbeat;
      if (world_size > 1 && Clock::now() - last_progress >= std::chrono::seconds(1)) {
        write_progress();
        last_progress = Clock::now();
      }
      std::optional<FlightEntry> late;
      {
        Recorder& rec = recorder();
        std::lock_guard<std::mutex> rlock(rec.mu);
        const double now = rec.now_s();
        for (const auto& [id, e] : rec.open)
          if (now - e.enqueued_s > options.timeout_s && (!late || e.enqueued_s < late->enqueued_s)) late = e;
      }
      if (late) expire(*late);
      std::string group, error;
      {
        std::lock_guard<std::mutex> wlock(watched().mu);
        for (const AsyncErrorWatch* w : watched().watches)
          if (error = w->poll(); !error.empty()) {
            group = w->label;
            break;
          }
      }
      if (!error.empty()) fail(group, error);
    }
  }
};

Watchdog& watchdog() {
  static Watchdog w;
  return w;
}

// The monitor: when the watchdog's heartbeat has not moved for the collective timeout (at least 10 s), the watchdog
// itself is stuck: say so and end the job.
void monitor(Watchdog& w) {
  const double limit = std::max(10.0, w.options.timeout_s);
  int64_t seen = -1;
  auto since = Clock::now();
  while (true) {
    {
      std::unique_lock<std::mutex> stop_lock(w.monitor_mu);
      if (w.monitor_cv.wait_for(stop_lock, std::chrono::milliseconds(500), [&] { return w.monitor_stop; })) return;
    }
    const int64_t beat = w.heartbeat.load();
    if (beat != seen) {
      seen = beat;
      since = Clock::now();
    } else if (std::chrono::duration<double>(Clock::now() - since).count() > limit) {
      std::fprintf(stderr,
                   "minidl: the collective watchdog of rank %d has not run for %.0f s (stuck itself); "
                   "ending the job with exit code %d\n",
                   w.rank, limit, kCollectiveTimeoutExit);
      std::fflush(stderr);
      w.abort_job();
    }
  }
}

}  // namespace

CallSite::CallSite(std::string label) : previous_(std::exchange(t_site, std::move(label))) {}
CallSite::~CallSite() { t_site = std::move(previous_); }

AsyncErrorWatch::AsyncErrorWatch(std::string group_label, std::function<std::string()> poll_fn)
    : label(std::move(group_label)), poll(std::move(poll_fn)) {
  std::lock_guard<std::mutex> lock(watched().mu);
  watched().watches.push_back(this);
}

AsyncErrorWatch::~AsyncErrorWatch() {
  std::lock_guard<std::mutex> lock(watched().mu);
  auto& w = watched().watches;
  w.erase(std::remove(w.begin(), w.end(), this), w.end());
}

int64_t record_call(ProcessGroup& group, const char* op, DType dtype, int64_t count, int peer, const char* reduce_op) {
  Recorder& rec = recorder();
  std::lock_guard<std::mutex> lock(rec.mu);
  if (rec.capacity == 0) return -1;  // recording off
  Recorder::Group& g = rec.groups[group.label()];
  if (g.world_ranks.empty()) g.world_ranks = group.world_ranks();
  FlightEntry e{group.label(),
                is_p2p(op) ? ++g.p2p_called : ++g.called,
                op,
                dtype,
                count,
                peer,
                reduce_op ? reduce_op : "",
                rec.now_s(),
                -1,
                FlightEntry::State::kEnqueued,
                t_site};
  const int64_t id = rec.next_id++;
  rec.ring.push_back(e);
  while (rec.ring.size() > rec.capacity) {
    rec.ring.pop_front();
    ++rec.first_id;
  }
  rec.open.emplace(id, std::move(e));
  return id;
}

void record_done(int64_t id, FlightEntry::State state) {
  Recorder& rec = recorder();
  std::lock_guard<std::mutex> lock(rec.mu);
  auto it = rec.open.find(id);
  if (it == rec.open.end()) return;
  Recorder::Group& g = rec.groups[it->second.group];
  int64_t& completed = is_p2p(it->second.op) ? g.p2p_completed : g.completed;
  completed = std::max(completed, it->second.seq);
  rec.open.erase(it);
  if (id < rec.first_id) return;  // the ring has dropped it already
  FlightEntry& e = rec.ring[size_t(id - rec.first_id)];
  e.state = state;
  e.completed_s = rec.now_s();
}

std::vector<FlightEntry> flight_entries() {
  Recorder& rec = recorder();
  std::lock_guard<std::mutex> lock(rec.mu);
  return {rec.ring.begin(), rec.ring.end()};
}

std::string dump_flight_recorder(const std::string& path) {
  Recorder& rec = recorder();
  nlohmann::json entries = nlohmann::json::array(), groups = nlohmann::json::object();
  double now = 0;
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    now = rec.now_s();
    for (const FlightEntry& e : rec.ring) entries.push_back(entry_json(e));
    for (const auto& [label, g] : rec.groups)
      groups[label] = {{"ranks", g.world_ranks},
                       {"called", g.called},
                       {"completed", g.completed},
                       {"p2p_called", g.p2p_called},
                       {"p2p_completed", g.p2p_completed}};
  }
  nlohmann::json j = {{"rank", watchdog().rank},
                      {"pid", int(::getpid())},
                      {"now_s", now},
                      {"timeout_s", watchdog().options.timeout_s},
                      {"capacity", rec.capacity},
                      {"groups", groups},
                      {"entries", entries}};
  if (!watchdog().verdict.is_null()) j["timeout"] = watchdog().verdict;
  std::error_code ignored;  // another rank may be creating it too
  fs::create_directories(fs::path(path).parent_path(), ignored);
  write_atomically(path, j.dump(1));
  return path;
}

void start_watchdog(const WatchdogOptions& options, int world_rank) {
  stop_watchdog();
  MINIDL_CHECK(options.timeout_s >= 0, "collective timeout: expected 0 (off) or a number of seconds, got ",
               options.timeout_s);
  MINIDL_CHECK(options.entries >= 0, "flight recorder: expected 0 (off) or more entries, got ", options.entries);
  {
    std::lock_guard<std::mutex> lock(recorder().mu);
    recorder().capacity = size_t(options.entries);
  }
  Watchdog& w = watchdog();
  w.options = options;
  w.rank = world_rank;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &w.world_size);
  if (options.timeout_s == 0) return;
  // The progress files (several ranks only) live in the debug directory from the start; dumps join them there.
  // Several ranks create it at once: an "exists" from the race is no error (the error_code form does not throw).
  std::error_code ignored;
  if (w.world_size > 1) fs::create_directories(options.debug_dir, ignored);
  w.stop = false;
  w.monitor_stop = false;
  w.thread = std::thread([&w] { w.run(); });
  w.monitor = std::thread([&w] { monitor(w); });
}

void stop_watchdog() {
  Watchdog& w = watchdog();
  if (!w.thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.stop = true;
  }
  w.cv.notify_all();
  w.thread.join();
  {
    std::lock_guard<std::mutex> lock(w.monitor_mu);
    w.monitor_stop = true;
  }
  w.monitor_cv.notify_all();
  w.monitor.join();
  // A run that ends well leaves nothing behind: its progress file, and the directory once no rank's is left.
  std::error_code ignored;
  fs::remove(w.path("progress", w.rank), ignored);
  if (fs::is_empty(w.options.debug_dir, ignored)) fs::remove(w.options.debug_dir, ignored);
}

WatchdogOptions watchdog_options() { return watchdog().options; }

WatchdogOptions watchdog_options_from_environment(const std::string& job) {
  WatchdogOptions o;
  auto number = [](const char* name, double fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    MINIDL_CHECK(end && *end == '\0' && x >= 0, name, ": expected a number >= 0, got '", v, "'");
    return x;
  };
  o.timeout_s = number("MINIDL_COLLECTIVE_TIMEOUT", o.timeout_s);
  o.entries = int64_t(number("MINIDL_FLIGHT_RECORDER_SIZE", double(o.entries)));
  const char* dir = std::getenv("MINIDL_DEBUG_DIR");
  const char* tmp = std::getenv("TMPDIR");
  o.debug_dir = dir && *dir ? dir : (fs::path(tmp && *tmp ? tmp : "/tmp") / ("minidl-" + job)).string();
  return o;
}

}  // namespace minidl::dist
