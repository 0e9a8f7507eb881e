// core/trace: spans and counters in Chrome's trace format, the clock offset in the file's metadata, the range
// hooks a device backend installs (NVTX on CUDA) called in the spans' nesting only while tracing is on, the device
// timer's intervals on their tracks (a fake device here; the CUDA one is tests/core/cuda/test_trace_device.cpp),
// and spans that allocate nothing while it is off (this binary counts the calls to operator new).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/trace.h"

namespace {
thread_local long t_allocations = 0;  // calls to operator new on this thread
}

// Counting replacements of the global allocation functions (the array and aligned forms call these). Not under
// AddressSanitizer, whose own replacements must stay.
#if !defined(__SANITIZE_ADDRESS__)
void* operator new(std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace minidl {
namespace {

// Off, a span costs no allocation, whatever its name's length (a std::string of more than 15 characters would
// allocate: "wait for all-gather", "all-gather parameters"); neither does a counter.
TEST(Trace, OffAllocatesNothing) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "allocations are not counted under AddressSanitizer";
#endif
  ASSERT_FALSE(trace::enabled());
  const long before = t_allocations;
  for (int i = 0; i < 100; ++i) {
    const trace::Span a("wait for all-gather of a block that has a long name");
    const trace::Span b(trace::enabled() ? std::string("step ") + std::to_string(i) : std::string());
    trace::counter("memory MiB", {{"params", 1.0}});
  }
  EXPECT_EQ(t_allocations - before, 0);
  const trace::Span counted("a name longer than fifteen characters, as a std::string" + std::string());
  EXPECT_GT(t_allocations - before, 0) << "the counting allocator counts nothing: the test above proves nothing";
}

std::vector<std::string> g_ranges;  // what the hooks saw: "+name" for a push, "-" for a pop

TEST(Trace, SpansReachTheFileAndTheRangeHooksInTheirNesting) {
  trace::set_range_hooks(
      {[](const char* name) { g_ranges.push_back(std::string("+") + name); }, [] { g_ranges.push_back("-"); }});
  g_ranges.clear();
  { const trace::Span off("before start"); }
  EXPECT_TRUE(g_ranges.empty()) << "a span while tracing is off pushed a range";

  const std::string path =
      (std::filesystem::temp_directory_path() / ("minidl_trace_" + std::to_string(::getpid()) + ".json")).string();
  trace::start(path, 3);
  {
    const trace::Span outer("outer");
    const trace::Span inner("inner");
  }
  trace::counter("memory MiB", {{"params", 1.5}});
  trace::set_clock_offset(-250.0, 4.0);
  EXPECT_EQ(trace::finish(), path);
  { const trace::Span after("after finish"); }
  trace::set_range_hooks({});
  EXPECT_EQ(g_ranges, (std::vector<std::string>{"+outer", "+inner", "-", "-"}));

  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  EXPECT_EQ(t.at("otherData").at("clock_offset_us"), -250.0);
  EXPECT_EQ(t.at("otherData").at("clock_uncertainty_us"), 4.0);
  std::vector<nlohmann::json> spans;
  for (const auto& e : t.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 3);
    if (e.at("ph") == "X") spans.push_back(e);
  }
  ASSERT_EQ(spans.size(), 2u);  // inner ends first
  EXPECT_EQ(spans[0].at("name"), "inner");
  EXPECT_EQ(spans[1].at("name"), "outer");
  EXPECT_LE(spans[1].at("ts").get<double>(), spans[0].at("ts").get<double>());
  EXPECT_GE(spans[1].at("ts").get<double>() + spans[1].at("dur").get<double>(),
            spans[0].at("ts").get<double>() + spans[0].at("dur").get<double>());
}

// A fake device for the device timer: it runs a span's work 1 ms after the host started the span and takes twice
// the host's time; it has run nothing until g_device_done.
struct FakeMark {
  double host_start = 0, host_end = 0;
};
bool g_device_done = false;
int g_begins = 0, g_reads = 0, g_restarts = 0, g_polls = 0;
std::vector<bool> g_thread_timed;  // what begin() was told, in order

const trace::DeviceTimer kFakeDevice{[](bool thread_timed) -> void* {
                                       ++g_begins;
                                       g_thread_timed.push_back(thread_timed);
                                       if (!thread_timed) return nullptr;
                                       return new FakeMark{trace::now_us(), 0};
                                     },
                                     [](void* mark) { static_cast<FakeMark*>(mark)->host_end = trace::now_us(); },
                                     [](void* opaque, bool wait, double* start_us, double* end_us, const char** track) {
                                       ++g_polls;
                                       if (!g_device_done && !wait) return false;
                                       const FakeMark* mark = static_cast<FakeMark*>(opaque);
                                       *start_us = mark->host_start + 1000;
                                       *end_us = *start_us + 2 * (mark->host_end - mark->host_start);
                                       *track = "fake device";
                                       delete mark;
                                       ++g_reads;
                                       return true;
                                     },
                                     [] { ++g_restarts; }};

// Spans of a timed thread get the device's interval on the device's track, read once the device has passed them
// (in batches: when 256 more wait than the last read left, and every one at finish); an untimed thread's spans get
// none; every mark is read once.
TEST(Trace, DeviceTimerIntervalsOnTheirTrack) {
  trace::set_device_timer(kFakeDevice);
  g_begins = g_reads = g_restarts = g_polls = 0;
  g_thread_timed.clear();
  g_device_done = false;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("minidl_trace_device_" + std::to_string(::getpid()) + ".json"))
          .string();
  trace::start(path, 0);
  EXPECT_EQ(g_restarts, 1);
  {
    const trace::Span outer("outer");
    const trace::Span inner("inner");
  }
  std::thread([] {
    trace::set_device_timing(false);
    const trace::Span s("untimed thread");
  }).join();
  std::thread([] { const trace::Span s("timed thread"); }).join();
  trace::collect_device_spans(/*wait=*/false);  // 3 marks polled, none passed: the next read at 3 + 256
  EXPECT_EQ(g_reads, 0) << "a mark the device has not passed was read";
  EXPECT_EQ(g_polls, 3);
  for (int i = 0; i < 300; ++i) trace::Span("many");  // one read at 259 waiting (none passed), the next at 515
  EXPECT_EQ(g_reads, 0);
  EXPECT_EQ(g_polls, 3 + 259) << "the marks left unread are polled again at every span";
  g_device_done = true;
  for (int i = 0; i < 211; ++i) trace::Span("more");  // 514 wait
  EXPECT_EQ(g_reads, 0);
  { const trace::Span last("last"); }  // 515 wait, the device has passed them: all are read
  EXPECT_EQ(g_reads, 515) << "the pending marks were not read in a batch";
  g_device_done = false;
  trace::Span("after");
  EXPECT_EQ(g_reads, 515);
  EXPECT_EQ(trace::finish(), path);
  trace::set_device_timer({});
  EXPECT_EQ(g_begins, 4 + 300 + 211 + 1 + 1);
  EXPECT_EQ(g_reads, g_begins - 1) << "every timed span's mark is read exactly once";
  EXPECT_EQ(g_thread_timed[2], false);
  EXPECT_EQ(g_thread_timed[3], true);

  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  int device_tid = -1;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("args").at("name") == "fake device")
      device_tid = e.at("tid");
  ASSERT_GE(device_tid, 0) << "no track named after the device timer's";
  std::map<std::string, std::vector<nlohmann::json>> host, device;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X") (e.at("tid") == device_tid ? device : host)[e.at("name")].push_back(e);
  EXPECT_EQ(device.count("untimed thread"), 0u);
  ASSERT_EQ(host.count("untimed thread"), 1u);
  for (const char* name : {"outer", "inner", "timed thread", "last"}) {
    ASSERT_EQ(device[name].size(), 1u) << name;
    ASSERT_EQ(host[name].size(), 1u) << name;
    const double host_ts = host[name][0].at("ts"), host_dur = host[name][0].at("dur");
    const double ts = device[name][0].at("ts"), dur = device[name][0].at("dur");
    // The fake's mark is taken just before the span's own clock reading, its end just after.
    EXPECT_NEAR(ts, host_ts + 1000, 50) << name;
    EXPECT_NEAR(dur, 2 * host_dur, 100) << name;
  }
  EXPECT_EQ(device["many"].size(), 300u);
  EXPECT_EQ(device["more"].size(), 211u);
}

}  // namespace
}  // namespace minidl
