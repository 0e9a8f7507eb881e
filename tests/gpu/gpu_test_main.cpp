// main() of the gpu.* test binaries (tests/gpu/CMakeLists.txt). In a process that sees no CUDA device (a build
// machine, CI), no test runs and the binary says so (CTest reads "no CUDA device" as a skip), so the same binaries
// list and run everywhere and test only on a GPU.
//
// MINIDL_REQUIRE_GPU=1 (scripts/gpu-run.sh --require-gpu, the mode for a GPU node) turns that skip into a failure:
// the binary prints cudaGetDeviceCount's error and exits 69 (sysexits.h's EX_UNAVAILABLE, which gpu-run.sh tags
// ENV) before running any test, so a node whose runtime cannot start reports a broken environment, never a pass.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr int kEnvBroken = 69;

// "" when a device is seen, otherwise why not.
std::string no_device_reason() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess)
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
  return devices == 0 ? "cudaGetDeviceCount: 0 devices" : "";
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef GTEST_FLAG_GET
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // listing needs no device
#else
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
#endif
  const std::string reason = no_device_reason();
  if (reason.empty()) return RUN_ALL_TESTS();
  const char* require = std::getenv("MINIDL_REQUIRE_GPU");
  if (require != nullptr && std::strcmp(require, "1") == 0) {
    std::fprintf(stderr, "minidl: MINIDL_REQUIRE_GPU=1 and no CUDA device (%s): no test was run\n", reason.c_str());
    return kEnvBroken;
  }
  // Not run, and said so: GoogleTest counts the tests of an environment that skips as passed, so none is started.
  std::printf("no CUDA device (%s): all %d tests skipped\n[  SKIPPED ] %d tests\n", reason.c_str(),
              ::testing::UnitTest::GetInstance()->total_test_count(),
              ::testing::UnitTest::GetInstance()->total_test_count());
  return 0;
}
