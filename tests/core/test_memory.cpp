#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace minidl;

TEST(Memory, LedgerTracksTagsAndPeaks) {
  MemoryLedger& l = ledger();
  int64_t before = l.current(MemTag::kActivations);
  l.reset_peaks();
  {
    MemoryTagGuard tag(MemTag::kActivations);
    Tensor a = Tensor::empty({1000}, DType::f32);
    EXPECT_EQ(l.current(MemTag::kActivations), before + 4032);  // 4000 rounded up to 64-byte blocks
    Tensor b = Tensor::empty({250}, DType::f32);
    EXPECT_EQ(l.peak(MemTag::kActivations), before + 4032 + 1024);
  }
  EXPECT_EQ(l.current(MemTag::kActivations), before);
  EXPECT_EQ(l.peak(MemTag::kActivations), before + 4032 + 1024);
  EXPECT_EQ(current_mem_tag(), MemTag::kOther);
}

TEST(Memory, CacheReusesBlocksWithoutSystemAllocation) {
  { Tensor warm = Tensor::empty({12345}); }
  int64_t allocs = cpu_system_allocs();
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::empty({12345});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  }
  EXPECT_EQ(cpu_system_allocs(), allocs);
}

// Shapes that change every step (a mixture of experts' rows per expert) reuse blocks of their size class: an
// exact-size cache kept one block per size ever seen (with 4 experts, ~50 MB more a step, 2.4 GB by step 32).
TEST(Memory, CacheServesChangingShapesFromBoundedMemory) {
  EXPECT_EQ(cpu_size_class(1), 64u);
  EXPECT_EQ(cpu_size_class(4096), 4096u);
  EXPECT_EQ(cpu_size_class(4097), 4608u);        // 4096 + 4096 / 8
  EXPECT_EQ(cpu_size_class(1 << 20), 1u << 20);  // a power of two is its own class
  EXPECT_EQ(cpu_size_class((1 << 20) + 1), (1u << 20) + (1u << 17));
  for (size_t n : {size_t(5000), size_t(123457), size_t(3) << 22}) {
    EXPECT_GE(cpu_size_class(n), n);
    EXPECT_LE(double(cpu_size_class(n)), 1.125 * double(n) + 64) << n;
  }
  uint64_t x = 12345;
  auto rows = [&x] { return int64_t(100000 + (x = x * 6364136223846793005ull + 1442695040888963407ull) % 100000); };
  for (int i = 0; i < 100; ++i) Tensor warm = Tensor::empty({rows()});  // 100k-200k floats: 400-800 KB
  const int64_t allocs = cpu_system_allocs(), cached = cpu_cached_bytes();
  for (int i = 0; i < 200; ++i) Tensor t = Tensor::empty({rows()});
  // Eight classes span the range, each warm by now: no more system allocations, no more cached bytes.
  EXPECT_LE(cpu_system_allocs() - allocs, 2);
  EXPECT_LE(cpu_cached_bytes() - cached, 2 * 900 * 1024);
}
