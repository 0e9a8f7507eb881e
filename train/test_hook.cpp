#include "train/test_hook.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace minidl::train {

namespace {

// The rank and milliseconds a variable asks for ("R:MS"), read once: the step loop calls the hook every step.
struct Delay {
  int rank = -1;
  double ms = 0;
  explicit Delay(const char* name) {
    const char* value = std::getenv(name);
    const char* colon = value ? std::strchr(value, ':') : nullptr;
    if (colon) rank = std::atoi(value), ms = std::atof(colon + 1);
  }
};

}  // namespace

void test_hook(TestHook hook, int rank) {
  static const Delay late("MINIDL_TEST_TRACE_LATE_RANK"), slow("MINIDL_TEST_SLOW_RANK");
  const Delay& d = hook == TestHook::kTraceStart ? late : slow;
  if (d.rank == rank && d.ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(d.ms));
}

}  // namespace minidl::train
