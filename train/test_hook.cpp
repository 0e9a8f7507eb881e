#include "train/test_hook.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace minidl::train {

void test_hook(TestHook hook, int rank) {
  const char* value =
      std::getenv(hook == TestHook::kTraceStart ? "MINIDL_TEST_TRACE_LATE_RANK" : "MINIDL_TEST_SLOW_RANK");
  if (!value || std::atoi(value) != rank) return;
  if (const char* colon = std::strchr(value, ':'))
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(std::atof(colon + 1)));
}

}  // namespace minidl::train
