#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <thread>
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

// Every index once, in pieces of at least half the grain (n / ceil(n / grain) items), at any thread count (the
// pieces may be run by any thread).
// Every index once, on at most ceil(n / grain) threads, in 4 pieces per thread of equal size (to one item): an op of
// 3 grains on 2 threads splits 8 ways, not 3 (one thread would own two of those).
TEST(ParallelFor, CoversEveryIndexOnceInFourEqualPiecesPerThread) {
  const int saved = num_threads();
  for (int threads : {1, 2, 3})
    for (int64_t n : {1, 2, 7, 8, 9, 100, 4099})
      for (int64_t grain : {1, 3, 64}) {
        set_num_threads(threads);
        SCOPED_TRACE(::testing::Message() << threads << " threads, n " << n << ", grain " << grain);
        std::vector<int> seen(size_t(n), 0);
        std::vector<int64_t> sizes(size_t(n) + 1, 0);  // sizes[b] = the length of the piece that begins at b
        parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LT(b, e);
          sizes[size_t(b)] = e - b;
          for (int64_t i = b; i < e; ++i) ++seen[size_t(i)];
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "index " << i;
        const int64_t used = std::min<int64_t>(threads, (n + grain - 1) / grain);
        const int64_t expected = used <= 1 ? 1 : std::min<int64_t>(4 * used, n);
        int64_t pieces = 0, smallest = n, largest = 0;
        for (int64_t b = 0; b < n; ++b)
          if (sizes[size_t(b)] > 0) {
            ++pieces;
            smallest = std::min(smallest, sizes[size_t(b)]);
            largest = std::max(largest, sizes[size_t(b)]);
          }
        EXPECT_EQ(pieces, expected);
        EXPECT_LE(largest - smallest, 1);
      }
  set_num_threads(saved);
}

// A thread that is held up (a shared VM's slow vCPU) does not hold up the region: the other thread, done with its
// own pieces, runs the held-up thread's remaining pieces.
TEST(ParallelFor, AThreadDoneEarlyTakesTheSlowThreadsPieces) {
  const int saved = num_threads();
  set_num_threads(2);
  std::vector<int> ran_on(8, -1);
  parallel_for(0, 8, 1, [&](int64_t b, int64_t e) {
    const int t = omp_get_thread_num();
    for (int64_t i = b; i < e; ++i) ran_on[size_t(i)] = t;
    if (t == 0 && b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // thread 0's first piece
  });
  int taken = 0;  // thread 0's own pieces (indices 0-3) that thread 1 ran
  for (int i = 0; i < 8; ++i) {
    ASSERT_NE(ran_on[size_t(i)], -1) << "index " << i << " never ran";
    if (i < 4 && ran_on[size_t(i)] == 1) ++taken;
  }
  EXPECT_GE(taken, 1) << "thread 1 waited for thread 0 instead of taking its pieces";
  set_num_threads(saved);
}
