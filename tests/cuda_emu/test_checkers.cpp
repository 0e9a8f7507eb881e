// The emulator's checkers (cuda_emu/check.h), each against the planted bug it exists for: every kernel below
// computes a plausible answer on the emulator without them, and each report must name the hazard, the kernel,
// the thread and the source line of the access (marked "// checker:<name>").
#include <fstream>
#include <string>

#include "kernels.h"
#include "support.h"

namespace emu_test {
namespace {

// The 1-based line of this file holding "// checker:<marker>".
int line_of(const std::string& marker) {
  std::ifstream in(std::string(MINIDL_SOURCE_DIR) + "/tests/cuda_emu/test_checkers.cpp");
  std::string line;
  for (int number = 1; std::getline(in, line); ++number)
    if (line.find("// checker:" + marker) != std::string::npos && line.find("line_of") == std::string::npos)
      return number;
  ADD_FAILURE() << "marker " << marker << " not found";
  return -1;
}
std::string at(const std::string& marker) { return "test_checkers\\.cpp:" + std::to_string(line_of(marker)); }

// ---- the planted bugs ----

__global__ void copy_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i];  // checker:copy
}

// Writes n + 1 elements: one past the end of its output.
__global__ void write_one_past_kernel(float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i <= n) out[i] = 1.0f;  // checker:one-past
}

// A block-wide sum in shared memory; `barrier` false removes the __syncthreads inside the tree. (volatile, as such
// code is written: without it the compiler may keep s[t] in a register, and the racy accesses never happen.)
__global__ void block_sum_kernel(const float* in, float* out, bool barrier) {
  volatile float* s = dynamic_smem<float>();
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] = s[t] + s[t + half];  // checker:tree
    if (barrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// The classic last-warp step of a 64-value reduction that assumes lockstep (volatile shared memory, no
// __syncwarp): lane t reads s[t + 16] while lane t + 16 writes it. `syncwarp` puts the __syncwarp calls in.
__global__ void warp_sum_kernel(const float* in, float* out, bool syncwarp) {
  volatile float* s = dynamic_smem<float>();
  const unsigned t = threadIdx.x;
  s[t] = in[t];
  __syncthreads();
  if (t < 32) {
    for (unsigned offset = 32; offset > 0; offset /= 2) {
      const float v = s[t] + s[t + offset];  // checker:warp-read
      if (syncwarp) __syncwarp();
      s[t] = v;  // checker:warp-write
      if (syncwarp) __syncwarp();
    }
  }
  if (t == 0) out[0] = s[0];
}

// Every thread of a block writes the block's one output: a race on global memory.
__global__ void all_write_kernel(float* out) {
  out[blockIdx.x] = static_cast<float>(threadIdx.x);  // checker:all-write
}

__global__ void count_kernel(unsigned* counter) { atomicAdd(counter, 1u); }

class Checkers : public ::testing::Test {
 protected:
  void SetUp() override {
    ::testing::FLAGS_gtest_death_test_style = "threadsafe";
    if (!minidl::emu::checks_compiled()) GTEST_SKIP() << "built with -DMINIDL_EMU_CHECKS=OFF";
  }
  // All checkers on, whatever MINIDL_EMU_CHECK says for the rest of the binary.
  ScopedOptions all_on_{[] {
    minidl::emu::Options o = minidl::emu::options();
    o.checks = minidl::emu::checks_compiled() ? minidl::emu::kAllChecks : 0;
    return o;
  }()};
};

TEST_F(Checkers, InitcheckReportsAKernelReadingMemoryNothingWrote) {
  const int n = 100;
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, n * sizeof(float)), cudaSuccess);
  EXPECT_DEATH((void)minidl::emu::launch(copy_kernel, 1, 128, 0, nullptr, in, out, n),
               "Uninitialized __global__ memory read of size 4 bytes\n.*in kernel emu_test::.*copy_kernel.*\n"
               ".*at .*" +
                   at("copy") +
                   "\n.*by thread \\([0-9]+,0,0\\) in block \\(0,0,0\\).*\n"
                   ".*Address 0x[0-9a-f]+ is at offset [0-9]+ of the allocation at 0x[0-9a-f]+ of 400 bytes");
  // Written by a copy, by a memset, or by a kernel: no report.
  std::vector<float> host(n, 2.0f);
  ASSERT_EQ(cudaMemcpy(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(minidl::emu::launch(copy_kernel, 1, 128, 0, nullptr, in, out, n), cudaSuccess);
  ASSERT_EQ(minidl::emu::launch(copy_kernel, 1, 128, 0, nullptr, out, in, n), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(minidl::emu::launch(copy_kernel, 1, 128, 0, nullptr, out, in, n), cudaSuccess);
  cudaFree(in);
  cudaFree(out);
}

TEST_F(Checkers, InitcheckReportsAReadOfUnwrittenSharedMemory) {
  DeviceBuffer<unsigned> out(64);
  EXPECT_DEATH((void)read_unwritten_smem(out.get(), 64),
               "Uninitialized __shared__ memory read of size 4 bytes\n.*read_unwritten_kernel.*\n.*kernels\\.cu:[0-9]+"
               "\n.*by thread \\([0-9]+,0,0\\).*\n.*offset [0-9]+ of dynamic shared memory");
}

// The caching allocator rounds a tensor's bytes up (core/cuda/allocator.cpp); a write past the tensor lands in
// the rounding, inside the block, where host AddressSanitizer sees nothing.
TEST_F(Checkers, MemcheckReportsAWritePastTheEndInsideAPooledBlock) {
  const int n = 250, capacity = 1024;  // 1000 bytes asked for, 1024 handed out
  float* block = nullptr;
  ASSERT_EQ(cudaMalloc(&block, capacity), cudaSuccess);
  minidl::emu::note_block_allocated(block, n * sizeof(float), capacity, true, nullptr);
  ASSERT_EQ(minidl::emu::launch(write_one_past_kernel, 1, 256, 0, nullptr, block, n - 1), cudaSuccess);  // fine
  EXPECT_DEATH((void)minidl::emu::launch(write_one_past_kernel, 1, 256, 0, nullptr, block, n),
               "Invalid __global__ write of size 4 bytes\n.*write_one_past_kernel.*\n.*" + at("one-past") +
                   "\n.*by thread \\(250,0,0\\) in block \\(0,0,0\\).*\n.*is out of bounds: 0 bytes after the end "
                   "of the allocation at 0x[0-9a-f]+ of 1000 bytes \\(a caching-allocator block of 1024\\)");
  minidl::emu::note_block_released(block, capacity, true, nullptr);
  EXPECT_DEATH((void)minidl::emu::launch(write_one_past_kernel, 1, 256, 0, nullptr, block, 0),
               "Invalid __global__ write of size 4 bytes\n(.*\n)*.*which was freed \\(offset 0\\)");
  cudaFree(block);
}

TEST_F(Checkers, MemcheckReportsUseAfterFreeAndTheRedZone) {
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(minidl::emu::launch(write_one_past_kernel, 1, 64, 0, nullptr, p, 63), cudaSuccess);
  EXPECT_DEATH((void)minidl::emu::launch(write_one_past_kernel, 1, 65, 0, nullptr, p, 64),
               "is out of bounds: 0 bytes after the end of the allocation at 0x[0-9a-f]+ of 256 bytes");
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_DEATH((void)minidl::emu::launch(write_one_past_kernel, 1, 64, 0, nullptr, p, 63),
               "Invalid __global__ write of size 4 bytes\n(.*\n)*.*which was freed");
}

TEST_F(Checkers, RacecheckReportsASharedReductionMissingABarrier) {
  const int threads = 64;
  std::vector<float> x(threads, 1.0f);
  DeviceBuffer<float> in(x), out(1);
  ASSERT_EQ(
      minidl::emu::launch(block_sum_kernel, 1, threads, threads * sizeof(float), nullptr, in.get(), out.get(), true),
      cudaSuccess);
  EXPECT_EQ(out.host()[0], 64.0f);
  // Without the barrier thread 0 reads s[16] in the second step, which thread 16 wrote in the first: forward order
  // happens to give 64 too, which is why only a checker sees it.
  EXPECT_DEATH((void)minidl::emu::launch(block_sum_kernel, 1, threads, threads * sizeof(float), nullptr, in.get(),
                                         out.get(), false),
               "Error: Race reported between (Write|Read) access at .*" + at("tree") +
                   " by thread \\([0-9]+,0,0\\)\n.*and (Read|Write) access at .*" + at("tree") +
                   " by thread \\([0-9]+,0,0\\)\n.*in kernel .*block_sum_kernel.*\n.*hazard on __shared__ address "
                   "0x[0-9a-f]+ \\(offset [0-9]+ of dynamic shared memory\\) in block \\(0,0,0\\)");
}

TEST_F(Checkers, RacecheckReportsAWarpReductionThatAssumesLockstep) {
  std::vector<float> x(64, 1.0f);
  DeviceBuffer<float> in(x), out(1);
  ASSERT_EQ(minidl::emu::launch(warp_sum_kernel, 1, 64, 64 * sizeof(float), nullptr, in.get(), out.get(), true),
            cudaSuccess);
  EXPECT_EQ(out.host()[0], 64.0f);
  EXPECT_DEATH(
      (void)minidl::emu::launch(warp_sum_kernel, 1, 64, 64 * sizeof(float), nullptr, in.get(), out.get(), false),
      "Error: Race reported between .*(" + at("warp-read") + "|" + at("warp-write") + ").*\n.*and .*(" +
          at("warp-read") + "|" + at("warp-write") + ")");
}

TEST_F(Checkers, RacecheckReportsThreadsOfABlockWritingOneGlobalWord) {
  DeviceBuffer<float> out(2);
  EXPECT_DEATH((void)minidl::emu::launch(all_write_kernel, 2, 32, 0, nullptr, out.get()),
               "Error: Race reported between Write access at .*" + at("all-write") +
                   " by thread \\([0-9]+,0,0\\)\n.*and Write access at .*" + at("all-write") +
                   " by thread \\([0-9]+,0,0\\)\n(.*\n)*.*Write-after-write hazard on __global__ address");
}

// The existing planted bug (kernels.cu's shift without its barrier) gives the right answer in forward order;
// racecheck reports it in every order.
TEST_F(Checkers, RacecheckFindsTheMissingBarrierThatForwardOrderHides) {
  minidl::emu::Options o = minidl::emu::options();
  o.order = minidl::emu::Order::kForward;
  ScopedOptions forward(o);
  const int threads = 64, n = 4 * threads;
  DeviceBuffer<float> in(std::vector<float>(n, 1.0f)), out(n);
  EXPECT_DEATH((void)shift_right(in.get(), out.get(), n, threads, false),
               "Race reported between Write access at .*shift_right_kernel.*kernels\\.cu:[0-9]+ by thread");
  ASSERT_EQ(shift_right(in.get(), out.get(), n, threads, true), cudaSuccess);
}

TEST_F(Checkers, AtomicsAreNeitherRacesNorUninitialised) {
  DeviceBuffer<unsigned> counter = DeviceBuffer<unsigned>::zeros(1);
  ASSERT_EQ(minidl::emu::launch(count_kernel, 4, 96, 0, nullptr, counter.get()), cudaSuccess);
  EXPECT_EQ(counter.host()[0], 4u * 96u);
  DeviceBuffer<unsigned> unwritten(1);
  EXPECT_DEATH((void)minidl::emu::launch(count_kernel, 1, 32, 0, nullptr, unwritten.get()),
               "Uninitialized __global__ memory read of size 4 bytes");
}

TEST_F(Checkers, EachCheckerCanBeTurnedOff) {
  minidl::emu::Options o = minidl::emu::options();
  o.checks = minidl::emu::kAllChecks & ~minidl::emu::kRacecheck;
  ScopedOptions no_racecheck(o);
  DeviceBuffer<float> out(2);
  ASSERT_EQ(minidl::emu::launch(all_write_kernel, 2, 32, 0, nullptr, out.get()), cudaSuccess);
  o.checks = 0;
  ScopedOptions none(o);
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(minidl::emu::launch(write_one_past_kernel, 1, 65, 0, nullptr, p, 64), cudaSuccess);
  cudaFree(p);
}

}  // namespace
}  // namespace emu_test
