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
