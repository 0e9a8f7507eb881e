// core/trace: spans and counters in Chrome's trace format, the clock offset in the file's metadata, the range
// hooks a device backend installs (NVTX on CUDA) called in the spans' nesting only while tracing is on, and spans
// that allocate nothing while it is off (this binary counts the calls to operator new).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
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

}  // namespace
}  // namespace minidl
