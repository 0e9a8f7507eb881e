// The emulator runs correct kernels correctly: barriers, shuffles, votes, atomics, shared memory, indexing,
// ragged blocks and partial warps. CTest runs this binary in forward, reverse and random thread order.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <numeric>

#include "kernels.h"
#include "support.h"

namespace emu_test {
namespace {

std::vector<float> ramp(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i % 17) - 8.0f + 0.25f * static_cast<float>(i % 5);
  return v;
}

class BlockSizes : public ::testing::TestWithParam<int> {};

TEST_P(BlockSizes, BlockReductionWithSharedMemory) {
  const int threads = GetParam(), n = 5 * threads + 7;  // a ragged last block
  const std::vector<float> x = ramp(n);
  DeviceBuffer<float> in(x), out(6);
  ASSERT_EQ(block_sums(in.get(), n, out.get(), threads), cudaSuccess);
  const std::vector<float> got = out.host();
  for (int b = 0; b < 6; ++b) {
    const auto first = x.begin() + b * threads, last = x.begin() + std::min(n, (b + 1) * threads);
    EXPECT_FLOAT_EQ(got[b], std::accumulate(first, last, 0.0f)) << "block " << b;
  }
}

TEST_P(BlockSizes, WarpShuffleReductionWithPartialWarps) {
  const int threads = GetParam(), n = 3 * threads - 5;
  const int warps_per_block = (threads + 31) / 32, blocks = 3;
  const std::vector<float> x = ramp(n);
  DeviceBuffer<float> in(x), out(blocks * warps_per_block);
  ASSERT_EQ(warp_sums(in.get(), n, out.get(), threads), cudaSuccess);
  const std::vector<float> got = out.host();
  for (int b = 0; b < blocks; ++b) {
    for (int w = 0; w < warps_per_block; ++w) {
      const int first = b * threads + w * 32, last = std::min({n, first + 32, (b + 1) * threads});
      const float want = std::accumulate(x.begin() + first, x.begin() + std::max(first, last), 0.0f);
      EXPECT_FLOAT_EQ(got[b * warps_per_block + w], want) << "block " << b << " warp " << w;
    }
  }
}

TEST_P(BlockSizes, WarpInclusiveScanWithShuffleUp) {
  const int threads = GetParam(), n = 2 * threads + 3;
  std::vector<int> x(n);
  std::iota(x.begin(), x.end(), 1);
  DeviceBuffer<int> in(x), out(n);
  ASSERT_EQ(warp_scans(in.get(), out.get(), n, threads), cudaSuccess);
  const std::vector<int> got = out.host();
  for (int i = 0, sum = 0; i < n; ++i) {
    sum = (i % threads) % 32 == 0 ? x[i] : sum + x[i];  // restarts at each warp of each block
    EXPECT_EQ(got[i], sum) << "i " << i;
  }
}

TEST_P(BlockSizes, SyncthreadsCountAndOr) {
  const int threads = GetParam();
  DeviceBuffer<int> out(4);
  ASSERT_EQ(barrier_votes(threads, out.get()), cudaSuccess);
  const std::vector<int> got = out.host();
  EXPECT_EQ(got[0], (threads + 2) / 3);
  EXPECT_EQ(got[1], 1);
  EXPECT_EQ(got[2], 1);
  EXPECT_EQ(got[3], 0);
}

TEST_P(BlockSizes, DynamicSharedMemoryReversesEachBlock) {
  const int threads = GetParam(), n = 4 * threads - 3;
  const std::vector<float> x = ramp(n);
  DeviceBuffer<float> in(x), out(n);
  ASSERT_EQ(reverse_blocks(in.get(), out.get(), n, threads), cudaSuccess);
  const std::vector<float> got = out.host();
  for (int base = 0; base < n; base += threads) {
    const int len = std::min(threads, n - base);
    for (int t = 0; t < len; ++t) EXPECT_EQ(got[base + t], x[base + len - 1 - t]) << "i " << base + t;
  }
}

TEST_P(BlockSizes, AtomicsFromManyBlocks) {
  const int threads = GetParam(), blocks = 64, total = threads * blocks;
  AtomicResults init{};
  init.max = -1;
  init.min = 1 << 30;
  DeviceBuffer<AtomicResults> r(std::vector<AtomicResults>{init});
  ASSERT_EQ(atomics(blocks, threads, r.get()), cudaSuccess);
  const AtomicResults got = r.host()[0];
  int max = -1, min = 1 << 30;
  double fsum = 0, dsum = 0;
  for (int i = 0; i < total; ++i) {
    max = std::max(max, i * 7919 % 10007), min = std::min(min, i * 7919 % 10007 - 5000);
    fsum += 0.1f * static_cast<float>(i % 10), dsum += 0.5 * (i % 4);
  }
  EXPECT_EQ(got.count, total);
  EXPECT_EQ(got.big, static_cast<unsigned long long>(total) << 33);
  EXPECT_EQ(got.max, max);
  EXPECT_EQ(got.min, min);
  EXPECT_NEAR(got.fsum, fsum, 1e-4 * fsum);
  EXPECT_EQ(got.dsum, dsum);  // multiples of 0.5: exact in any order
  EXPECT_EQ(got.cas, total);
  EXPECT_EQ(got.exch_hits, 1u);
}

INSTANTIATE_TEST_SUITE_P(Emulator, BlockSizes, ::testing::Values(32, 48, 100, 256, 1024));

TEST(Emulator, SegmentedXorShuffle) {
  for (const int width : {2, 8, 32}) {
    std::vector<int> x(128);
    std::iota(x.begin(), x.end(), 0);
    DeviceBuffer<int> in(x), out(x.size());
    ASSERT_EQ(segment_sums(in.get(), out.get(), 128, width), cudaSuccess);
    const std::vector<int> got = out.host();
    for (int i = 0; i < 128; ++i) {
      const int first = i / width * width;
      EXPECT_EQ(got[i], std::accumulate(x.begin() + first, x.begin() + first + width, 0)) << "width " << width;
    }
  }
}

TEST(Emulator, ShuffleFromAbsentLaneReadsAllOnes) {
  DeviceBuffer<unsigned> out(16);
  ASSERT_EQ(shuffle_half_warp(out.get()), cudaSuccess);
  const std::vector<unsigned> got = out.host();
  for (unsigned lane = 0; lane < 16; ++lane) EXPECT_EQ(got[lane], lane == 3 ? ~0u : (lane ^ 1u) * 10u) << lane;
}

TEST(Emulator, VotesWithPartialMask) {
  DeviceBuffer<int> out(std::vector<int>(128, -7));
  ASSERT_EQ(vote_even_lanes(out.get()), cudaSuccess);
  const std::vector<int> got = out.host();
  for (int lane = 0; lane < 32; ++lane) {
    const int* v = &got[4 * lane];
    if (lane % 2 != 0) {
      EXPECT_EQ(v[0], -7);
      continue;
    }
    EXPECT_EQ(static_cast<unsigned>(v[0]), 0x11111111u) << lane;
    EXPECT_EQ(v[1], 1);
    EXPECT_EQ(v[2], 1);
    EXPECT_EQ(v[3], 0);
  }
}

TEST(Emulator, EightByteAndSixteenBitShuffles) {
  std::vector<double> d(32);
  std::vector<long long> ll(32);
  std::vector<__half> h(32);
  std::vector<__nv_bfloat16> b(32);
  for (int i = 0; i < 32; ++i) {
    d[i] = 1e300 * i, ll[i] = (1ll << 40) + i;
    h[i] = __float2half(0.5f + i), b[i] = __float2bfloat16(static_cast<float>(-i));
  }
  DeviceBuffer<double> dd(d);
  DeviceBuffer<long long> dll(ll);
  DeviceBuffer<__half> dh(h);
  DeviceBuffer<__nv_bfloat16> db(b);
  ASSERT_EQ(wide_shuffles(dd.get(), dll.get(), dh.get(), db.get()), cudaSuccess);
  const std::vector<double> gd = dd.host();
  const std::vector<long long> gll = dll.host();
  const std::vector<__half> gh = dh.host();
  const std::vector<__nv_bfloat16> gb = db.host();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(gd[i], d[i ^ 1]);
    EXPECT_EQ(gll[i], ll[i < 31 ? i + 1 : i]);
    EXPECT_EQ(__half2float(gh[i]), 0.5f);
    EXPECT_EQ(__bfloat162float(gb[i]), static_cast<float>(-(i >= 2 ? i - 2 : i)));
  }
}

TEST(EmulatedIntrinsics, DeviceOnlyMathOnTheHost) {
  EXPECT_NEAR(__half2float(hexp(__float2half(1.0f))), 2.71828f, 2e-3);
  EXPECT_EQ(__half2float(__hfma(__float2half(2.0f), __float2half(3.0f), __float2half(1.0f))), 7.0f);
  EXPECT_NEAR(__bfloat162float(hrsqrt(__float2bfloat16(4.0f))), 0.5f, 1e-2);
  const __half2 e = h2exp(__floats2half2_rn(0.0f, 1.0f));
  EXPECT_EQ(__low2float(e), 1.0f);
  EXPECT_NEAR(__high2float(e), 2.71828f, 2e-3);
  const __nv_bfloat162 f =
      __hfma2(__floats2bfloat162_rn(1.0f, 2.0f), __floats2bfloat162_rn(3.0f, 4.0f), __floats2bfloat162_rn(0.5f, 0.5f));
  EXPECT_EQ(__low2float(f), 3.5f);
  EXPECT_EQ(__high2float(f), 8.5f);
  EXPECT_FLOAT_EQ(__expf(1.0f), std::exp(1.0f));
  EXPECT_EQ(__saturatef(2.0f), 1.0f);
  EXPECT_EQ(__saturatef(NAN), 0.0f);
  EXPECT_EQ(__popc(0xF0F0u), 8);
  EXPECT_EQ(__brev(1u), 0x80000000u);
  EXPECT_EQ(__ffs(8), 4);
  EXPECT_EQ(__clz(1), 31);
  EXPECT_EQ(max(3, 5u), 5u);
  __half h = __float2half(1.0f);
  EXPECT_EQ(__half2float(atomicAdd(&h, __float2half(0.5f))), 1.0f);
  EXPECT_EQ(__half2float(h), 1.5f);
  __nv_bfloat16 bf = __float2bfloat16(2.0f);
  atomicAdd(&bf, __float2bfloat16(1.0f));
  EXPECT_EQ(__bfloat162float(bf), 3.0f);
}

TEST(Emulator, UnwrittenDynamicSharedMemoryIsPoisoned) {
  ScopedOptions scope(ScopedOptions::without_checks(minidl::emu::kInitcheck));  // which would stop the read
  DeviceBuffer<unsigned> out(64);
  ASSERT_EQ(read_unwritten_smem(out.get(), 64), cudaSuccess);
  for (const unsigned bits : out.host()) EXPECT_EQ(bits, 0xffffffffu);  // a NaN when read as float
}

// Blocks after the first read what no thread of theirs wrote: poison, not block 0's values. With one worker
// every block runs where block 0 ran; with several, wherever.
TEST(Emulator, UnwrittenStaticSharedMemoryIsPoisonedInEachBlock) {
  for (const int workers : {1, minidl::emu::options().workers}) {
    minidl::emu::Options o = ScopedOptions::without_checks(minidl::emu::kInitcheck);  // which would stop the read
    o.workers = workers;
    ScopedOptions scope(o);
    const int blocks = 5;
    DeviceBuffer<unsigned> out(64 * blocks);
    ASSERT_EQ(read_unwritten_static_smem(out.get(), blocks), cudaSuccess);
    const std::vector<unsigned> got = out.host();
    for (int i = 0; i < 64 * blocks; ++i)
      ASSERT_EQ(got[i], i < 64 ? 7u + i : 0xffffffffu) << "element " << i << ", " << workers << " workers";
  }
}

// A raw __shared__ (thread_local) still compiles for third-party code, and keeps the previous block's values:
// the limit that MINIDL_SHARED removes.
TEST(Emulator, RawSharedKeepsThePreviousBlocksValues) {
  minidl::emu::Options o = minidl::emu::options();
  o.workers = 1;
  ScopedOptions scope(o);
  const auto kernel = +[](unsigned* out) {
    __shared__ unsigned slots[64];
    if (blockIdx.x == 0) slots[threadIdx.x] = 7u + threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = slots[threadIdx.x];
  };
  DeviceBuffer<unsigned> out(64 * 3);
  ASSERT_EQ(minidl::emu::launch(kernel, 3, 64, 0, nullptr, out.get()), cudaSuccess);
  const std::vector<unsigned> got = out.host();
  for (int i = 0; i < 64 * 3; ++i) ASSERT_EQ(got[i], 7u + i % 64) << i;
}

TEST(Emulator, StaticSharedMemoryAcrossManyBlocksInEveryOrder) {
  for (const minidl::emu::Order order :
       {minidl::emu::Order::kForward, minidl::emu::Order::kReverse, minidl::emu::Order::kRandom}) {
    ScopedOptions scope(ScopedOptions::with_order(order));
    const int threads = 96, n = 40 * threads - 13;
    const std::vector<float> x = ramp(n);
    DeviceBuffer<float> in(x), out(n);
    ASSERT_EQ(shift_right_static(in.get(), out.get(), n, threads, true), cudaSuccess);
    const std::vector<float> got = out.host();
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(got[i], i % threads == 0 ? 0.0f : x[i - 1]) << i << ", order " << static_cast<int>(order);
  }
}

// Several declarations in one kernel: separate storage, each aligned to at least 16 bytes; a scalar too.
TEST(Emulator, StaticSharedDeclarationsAreSeparateAndAligned) {
  const auto kernel = +[](unsigned long long* out) {
    MINIDL_SHARED(char, bytes, [5]);
    MINIDL_SHARED(double, values, [3]);
    MINIDL_SHARED(int, count, );
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    atomicAdd(&count, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      out[0] = static_cast<unsigned long long>(count);
      out[1] = reinterpret_cast<uintptr_t>(bytes) % 16 + reinterpret_cast<uintptr_t>(values) % 16;
      out[2] = static_cast<void*>(bytes) != static_cast<void*>(values) &&
               static_cast<void*>(values) != static_cast<void*>(&count);
    }
  };
  DeviceBuffer<unsigned long long> out(3);
  ASSERT_EQ(minidl::emu::launch(kernel, 4, 70, 0, nullptr, out.get()), cudaSuccess);
  EXPECT_EQ(out.host(), (std::vector<unsigned long long>{70, 0, 1}));
}

TEST(Emulator, TwoDimensionalGridOfTwoDimensionalBlocks) {
  const int width = 37, height = 23;
  DeviceBuffer<int> out(std::vector<int>(width * height, -1));
  ASSERT_EQ(index_2d(out.get(), width, height, dim3(8, 4)), cudaSuccess);
  const std::vector<int> got = out.host();
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) ASSERT_EQ(got[y * width + x], x << 16 | y) << x << "," << y;
}

TEST(Emulator, ThreeDimensionalBuiltins) {
  DeviceBuffer<int> out(std::vector<int>(8 * 24, -1));
  ASSERT_EQ(index_3d(out.get()), cudaSuccess);
  const std::vector<int> got = out.host();
  for (int i = 0; i < 8 * 24; ++i) EXPECT_EQ(got[i], i / 24 * 1000 + i % 24) << i;
}

TEST(Emulator, SoftmaxMatchesReferenceAndTiming) {
  const int rows = 256, cols = 1024;
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 4.0f;
  DeviceBuffer<float> in(x), out(x.size());
  ASSERT_EQ(softmax_rows(in.get(), out.get(), 4, cols, 256), cudaSuccess);  // warm-up: stacks, workers
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();  // CPU time of all workers: the wall time depends on the load
  ASSERT_EQ(softmax_rows(in.get(), out.get(), rows, cols, 256), cudaSuccess);
  const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ emulated softmax %dx%d, 256 threads a block, %d workers: %.1f ms, %.1f ms CPU ]\n", rows, cols,
              minidl::emu::options().workers, ms, cpu_ms);
  const std::vector<float> got = out.host();
  for (int r = 0; r < rows; ++r) {
    const float* row = &x[static_cast<size_t>(r) * cols];
    const float m = *std::max_element(row, row + cols);
    double sum = 0;
    for (int c = 0; c < cols; ++c) sum += std::exp(row[c] - m);
    for (int c = 0; c < cols; ++c)
      ASSERT_NEAR(got[static_cast<size_t>(r) * cols + c], std::exp(row[c] - m) / sum, 1e-6) << r << "," << c;
  }
}

}  // namespace
}  // namespace emu_test
