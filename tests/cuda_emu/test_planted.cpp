// Planted bugs (kernels.cu): the emulator must expose a missing barrier, and abort with the source lines on a
// divergent barrier and on deadlocks, whatever order MINIDL_EMU_ORDER selects for the rest of the binary.
#include <cmath>
#include <string>

#include "kernels.h"
#include "support.h"

namespace emu_test {
namespace {

using minidl::emu::Order;

class PlantedBugs : public ::testing::Test {
 protected:
  void SetUp() override { ::testing::FLAGS_gtest_death_test_style = "threadsafe"; }
};

std::string at(const char* marker) { return "kernels\\.cu:" + std::to_string(planted_line(marker)); }

// Runs the shift kernel in `order`; returns how many outputs are wrong (poisoned reads are NaN).
int wrong_shifts(Order order, bool with_barrier) {
  minidl::emu::Options o = ScopedOptions::with_order(order);
  o.checks = 0;  // racecheck and initcheck stop this kernel (test_checkers.cpp): here, what it computes without them
  ScopedOptions scope(o);
  const int threads = 64, n = 4 * threads;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  DeviceBuffer<float> in(x), out(n);
  EXPECT_EQ(shift_right(in.get(), out.get(), n, threads, with_barrier), cudaSuccess);
  const std::vector<float> got = out.host();
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += !(got[i] == (i % threads == 0 ? 0.0f : x[i - 1]));
  return wrong;
}

TEST_F(PlantedBugs, MissingBarrierShowsAsPoisonInReverseOrder) {
  // Forward order runs each writer before its reader, which hides the bug: that is why the suite runs in
  // more than one order.
  EXPECT_EQ(wrong_shifts(Order::kForward, false), 0);
  EXPECT_EQ(wrong_shifts(Order::kReverse, false), 4 * 63);  // every read of a neighbour is poison
  EXPECT_GT(wrong_shifts(Order::kRandom, false), 0);
  for (const Order order : {Order::kForward, Order::kReverse, Order::kRandom})
    EXPECT_EQ(wrong_shifts(order, true), 0) << "with the barrier, order " << static_cast<int>(order);
}

// The same bug through MINIDL_SHARED, on one worker so each block runs where the previous one wrote the
// array: in reverse order every read of a neighbour is poison (NaN), never the previous block's value.
TEST_F(PlantedBugs, MissingBarrierOnStaticSharedMemoryReadsPoisonNotTheLastBlock) {
  minidl::emu::Options o = ScopedOptions::with_order(Order::kReverse);
  o.workers = 1;
  o.checks = 0;
  ScopedOptions scope(o);
  const int threads = 64, n = 4 * threads;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  DeviceBuffer<float> in(x), out(n);
  ASSERT_EQ(shift_right_static(in.get(), out.get(), n, threads, false), cudaSuccess);
  const std::vector<float> got = out.host();
  for (int i = 0; i < n; ++i) {
    if (i % threads == 0)
      EXPECT_EQ(got[i], 0.0f) << i;
    else
      EXPECT_TRUE(std::isnan(got[i])) << i << ": " << got[i];
  }
}

TEST_F(PlantedBugs, StaticSharedMemoryOver48KiBAbortsWithTheSite) {
  const int line = __LINE__ + 3;
  const auto kernel = +[](float* out) {
    MINIDL_SHARED(float, first, [8 * 1024]);
    MINIDL_SHARED(float, second, [4 * 1024 + 1]);
    first[threadIdx.x] = second[threadIdx.x] = 1.0f;
    out[threadIdx.x] = first[threadIdx.x] + second[threadIdx.x];
  };
  DeviceBuffer<float> out(32);
  EXPECT_DEATH((void)minidl::emu::launch(kernel, 1, 32, 0, nullptr, out.get()),
               "static shared memory over 49152 bytes in block \\(0,0,0\\).*: second \\(16388 bytes\\) at [^ ]*"
               "test_planted\\.cpp:" +
                   std::to_string(line) + " brings it to 49156 bytes");
}

TEST_F(PlantedBugs, StaticAndDynamicSharedMemoryOverTheLimitAbort) {
  const int line = __LINE__ + 2;
  const auto kernel = +[](float* out) {
    MINIDL_SHARED(float, tile, [10 * 1024]);
    tile[threadIdx.x] = dynamic_smem<float>()[threadIdx.x] = 1.0f;
    out[threadIdx.x] = tile[threadIdx.x];
  };
  DeviceBuffer<float> out(32);
  EXPECT_DEATH((void)minidl::emu::launch(kernel, 1, 32, 16 * 1024, nullptr, out.get()),
               "shared memory over 49152 bytes in block.*: tile \\(40960 bytes\\) at [^ ]*test_planted\\.cpp:" +
                   std::to_string(line) + " brings the static part to 40960 bytes, plus 16384 dynamic");
}

TEST_F(PlantedBugs, DivergentBarrierAbortsWithBothLines) {
  DeviceBuffer<float> out(64);
  const std::string report =
      "divergent barrier in block \\(0,0,0\\) of grid \\(1,1,1\\) x \\(64,1,1\\): "
      "threads 0-31 at [^ ]*" +
      at("planted:divergent-low") + ", threads 32-63 at [^ ]*" + at("planted:divergent-high");
  EXPECT_DEATH((void)divergent_barrier(out.get()), report);
}

TEST_F(PlantedBugs, BarrierAfterSomeThreadsReturnedIsADeadlock) {
  DeviceBuffer<float> out(64);
  const std::string report = "deadlock in block \\(0,0,0\\).*threads 0-15: waiting in __syncthreads\\(\\) at [^ ]*" +
                             at("planted:after-return") + ".*threads 16-63: returned";
  EXPECT_DEATH((void)barrier_after_return(out.get()), report);
}

TEST_F(PlantedBugs, ShuffleWaitingForLanesAtABarrierIsADeadlock) {
  DeviceBuffer<float> out(32);
  const std::string report = "deadlock in block.*threads 0-15: waiting in __shfl_sync\\(mask 0xffffffff\\) at [^ ]*" +
                             at("planted:shuffle") + ".*threads 16-31: waiting in __syncthreads\\(\\) at [^ ]*" +
                             at("planted:barrier");
  EXPECT_DEATH((void)shuffle_against_barrier(out.get()), report);
}

TEST_F(PlantedBugs, MismatchedWarpCollectivesAbortWithBothLines) {
  DeviceBuffer<int> out(32);
  const int shuffle_line = __LINE__ + 3, ballot_line = __LINE__ + 5;
  const auto kernel = +[](int* out) {
    if (threadIdx.x < 16)
      out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    else
      out[threadIdx.x] = static_cast<int>(__ballot_sync(0xffffffffu, 1));
  };
  const std::string report =
      "mismatched warp collective in block.*warp 0: "
      "lanes 0-15 in __shfl_sync\\(mask 0xffffffff\\) at [^ ]*test_planted\\.cpp:" +
      std::to_string(shuffle_line) +
      ", lanes 16-31 in __ballot_sync\\(mask 0xffffffff\\) at [^ ]*test_planted\\.cpp:" + std::to_string(ballot_line);
  EXPECT_DEATH((void)minidl::emu::launch(kernel, 1, 32, 0, nullptr, out.get()), report);
}

int recurse(int depth) {
  volatile char frame[512];
  frame[depth % 512] = 1;
  return depth == 0 ? 0 : recurse(depth - 1) + frame[depth % 512];
}

TEST_F(PlantedBugs, StackOverflowHitsTheGuardPage) {
  const auto kernel = +[](int depth) { (void)recurse(depth); };
  EXPECT_DEATH((void)minidl::emu::launch(kernel, 1, 1, 0, nullptr, 1 << 20), "");
}

TEST_F(PlantedBugs, WithoutStrictModeReturnedThreadsCountAsArrived) {
  minidl::emu::Options lenient = minidl::emu::options();
  lenient.strict = false;
  ScopedOptions scope(lenient);
  DeviceBuffer<float> out(std::vector<float>(64, 0.0f));
  ASSERT_EQ(barrier_after_return(out.get()), cudaSuccess);
  const std::vector<float> got = out.host();
  for (int t = 0; t < 64; ++t) EXPECT_EQ(got[t], t < 16 ? 1.0f : 0.0f);
}

}  // namespace
}  // namespace emu_test
