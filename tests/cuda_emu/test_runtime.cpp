// The emulated host runtime: memory, copies, streams/events, device queries, and launch errors that set
// the last error as CUDA does.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <set>
#include <thread>

#include "kernels.h"
#include "support.h"

namespace emu_test {
namespace {

TEST(EmulatedRuntime, MemcpyRoundTripsInEveryDirection) {
  std::vector<int> src(1000), back(1000, 0);
  std::iota(src.begin(), src.end(), -500);
  int *a = nullptr, *b = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 1000 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 1000 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 1000 * sizeof(int)), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);  // CUDA's allocation alignment
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(a, src.data(), 4000, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(b, a, 4000, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(pinned, b, 4000, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(back.data(), pinned, 4000, cudaMemcpyHostToHost, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(back, src);
  EXPECT_EQ(cudaMemcpy(back.data(), a, 4000, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, src);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

TEST(EmulatedRuntime, MemsetSetsBytes) {
  DeviceBuffer<unsigned char> buf(100);
  ASSERT_EQ(cudaMemset(buf.get(), 0xAB, 100), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buf.get() + 10, 0, 5, nullptr), cudaSuccess);
  const std::vector<unsigned char> got = buf.host();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], i >= 10 && i < 15 ? 0 : 0xAB) << i;
}

TEST(EmulatedRuntime, ErrorsAreReportedAndLastErrorIsCleared) {
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int x = 0;
  EXPECT_EQ(cudaMemcpy(&x, &x, 4, static_cast<cudaMemcpyKind>(17)), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(&x), cudaErrorInvalidValue);  // not from cudaMalloc
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_STREQ(cudaGetErrorString(cudaGetLastError()), "invalid device ordinal");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidConfiguration), "cudaErrorInvalidConfiguration");
  void* p = &x;
  EXPECT_EQ(cudaMalloc(&p, 0), cudaSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
}

TEST(EmulatedRuntime, OneDeviceWithPlausibleProperties) {
  int count = 0, device = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "minidl CUDA emulator");
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(prop.sharedMemPerBlock, 48u * 1024);
  EXPECT_GE(prop.multiProcessorCount, 1);
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(sms, prop.multiProcessorCount);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(EmulatedRuntime, EventsTimeTheWorkBetweenThem) {
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle);  // not recorded yet
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(start, nullptr), cudaSuccess);
  EXPECT_EQ(empty_launch(64, 256, 0), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(stop, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(nullptr, stop, 0), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(stop), cudaSuccess);
}

TEST(EmulatedRuntime, BadLaunchConfigurationsSetTheLastError) {
  EXPECT_EQ(empty_launch(1, 1025, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // launch_kernel returned (and so cleared) it
  EXPECT_EQ(empty_launch(1, dim3(32, 32, 2), 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(empty_launch(1, dim3(1, 1, 65), 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(empty_launch(0, 32, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(empty_launch(dim3(1, 65536), 32, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(empty_launch(1, 32, 48 * 1024), cudaSuccess);
  EXPECT_EQ(empty_launch(1, 32, 48 * 1024 + 1), cudaErrorInvalidValue);  // above the default limit
  EXPECT_EQ(allow_dynamic_smem(1 << 20), cudaErrorInvalidValue);         // above the opt-in limit
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(allow_dynamic_smem(100 * 1024), cudaSuccess);
  EXPECT_EQ(empty_launch(1, 32, 100 * 1024), cudaSuccess);
  EXPECT_EQ(empty_launch(1, 32, 100 * 1024 + 1), cudaErrorInvalidValue);

  // The raw emulated launch records the error for cudaGetLastError, like <<<>>> does.
  EXPECT_EQ(minidl::emu::launch(
                +[](int) {}, 1, 2048, 0, nullptr, 1),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(EmulatedRuntime, BlocksRunInParallelOnTheWorkers) {
  minidl::emu::Options two = minidl::emu::options();
  two.workers = 2;
  ScopedOptions scope(two);
  DeviceBuffer<int> tids(16);
  const auto kernel = +[](int* out) {
    if (threadIdx.x == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(gettid());
  };
  ASSERT_EQ(minidl::emu::launch(kernel, 16, 64, 0, nullptr, tids.get()), cudaSuccess);
  const std::vector<int> got = tids.host();
  EXPECT_EQ(std::set<int>(got.begin(), got.end()).size(), 2u);
}

}  // namespace
}  // namespace emu_test
