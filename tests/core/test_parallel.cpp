#include <gtest/gtest.h>

#include <vector>

#include "core/parallel.h"

using namespace minidl;

// Every item of every part is visited once, with its part and its offset in that part, at any thread count, with
// empty parts anywhere and parts smaller than the grain; within a thread the pieces come in part order.
TEST(ParallelForParts, VisitsEveryItemOnceAtAnyThreadCount) {
  const int saved = num_threads();
  const std::vector<std::vector<int64_t>> cases = {
      {}, {0}, {5}, {0, 3, 0, 0, 7, 0}, {1, 1, 1, 1, 1}, {100000, 3, 70000, 0, 1}, {65536, 65536}};
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const std::vector<int64_t>& sizes : cases)
      for (int64_t grain : {1, 64, 1 << 14}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, " << sizes.size() << " parts, grain " << grain);
        std::vector<std::vector<int>> seen;
        for (int64_t n : sizes) seen.emplace_back(size_t(n), 0);
        parallel_for_parts(sizes, grain, [&](size_t part, int64_t begin, int64_t end) {
          ASSERT_LT(part, sizes.size());
          ASSERT_LE(0, begin);
          ASSERT_LT(begin, end);
          ASSERT_LE(end, sizes[part]);
          for (int64_t i = begin; i < end; ++i) ++seen[part][size_t(i)];  // pieces never overlap: no race
        });
        for (size_t p = 0; p < sizes.size(); ++p)
          for (size_t i = 0; i < seen[p].size(); ++i) ASSERT_EQ(seen[p][i], 1) << "part " << p << " item " << i;
      }
  }
  set_num_threads(saved);
}
