// main() of the gpu.* test binaries (tests/gpu/CMakeLists.txt): every test skips, saying so, in a process that sees
// no CUDA device (a build machine, CI), so the same binaries list and run everywhere and test only on a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace {

class RequireCudaDevice : public ::testing::Environment {
 public:
  void SetUp() override {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device (" << (status == cudaSuccess ? "none found" : cudaGetErrorString(status)) << ")";
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new RequireCudaDevice);
  return RUN_ALL_TESTS();
}
