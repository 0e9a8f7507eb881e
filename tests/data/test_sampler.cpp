#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data/sampler.h"
#include "data_test_util.h"

using namespace minidl;
using minidl::testing::expect_error_containing;

// Tokens 0, 1, 2, ...: a window's first token is its start offset.
static std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

static std::vector<double> rows(const Tensor& t) { return t.to_vector(); }

TEST(BatchSampler, PureFunctionOfSeedAndStep) {
  data::BatchSampler a(iota_tokens(1000), 16, 8, 42), b(iota_tokens(1000), 16, 8, 42), c(iota_tokens(1000), 16, 8, 7);
  EXPECT_EQ(rows(a.batch(3).x), rows(b.batch(3).x));
  EXPECT_EQ(rows(a.batch(3).y), rows(b.batch(3).y));
  EXPECT_NE(rows(a.batch(3).x), rows(a.batch(4).x));
  EXPECT_NE(rows(a.batch(3).x), rows(c.batch(3).x));
  EXPECT_EQ(a.batch(3).x.shape(), (Shape{8, 16}));
  EXPECT_EQ(a.batch(3).x.dtype(), DType::i32);
}

TEST(BatchSampler, RankSlicesConcatenateToTheGlobalBatch) {
  const int64_t global = 12, seq = 5;
  data::BatchSampler sampler(iota_tokens(500), seq, global, 1234);
  for (int64_t step : {0, 1, 17}) {
    data::Batch full = sampler.batch(step);
    for (int64_t ranks : {2, 3, 4, 5}) {  // 5 ranks: uneven slices 2, 2, 3, 2, 3
      std::vector<double> xs, ys;
      for (int64_t r = 0; r < ranks; ++r) {
        int64_t begin = global * r / ranks, end = global * (r + 1) / ranks;
        data::Batch part = sampler.batch(step, begin, end - begin);
        EXPECT_EQ(part.x.shape(), (Shape{end - begin, seq}));
        for (double v : rows(part.x)) xs.push_back(v);
        for (double v : rows(part.y)) ys.push_back(v);
      }
      EXPECT_EQ(xs, rows(full.x)) << ranks << " ranks, step " << step;
      EXPECT_EQ(ys, rows(full.y)) << ranks << " ranks, step " << step;
    }
  }
}

TEST(BatchSampler, TargetsAreInputsShiftedByOne) {
  const int64_t seq = 8;
  data::BatchSampler sampler(iota_tokens(300), seq, 4, 5);
  data::Batch b = sampler.batch(2);
  std::vector<double> x = rows(b.x), y = rows(b.y);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(x[size_t(r * seq)], double(sampler.start_offset(2, r)));
    for (int64_t t = 0; t < seq; ++t) EXPECT_EQ(y[size_t(r * seq + t)], x[size_t(r * seq + t)] + 1);
  }
}

TEST(BatchSampler, OffsetsCoverTheWholeValidRange) {
  // len = seq + 2: the only valid starts are 0 and 1, and both must occur.
  data::BatchSampler tight(iota_tokens(10), 8, 64, 9);
  std::set<int64_t> seen;
  for (int64_t s = 0; s < 64; ++s) seen.insert(tight.start_offset(0, s));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1}));
  data::BatchSampler exact(iota_tokens(9), 8, 4, 9);  // len = seq + 1: one window
  EXPECT_EQ(rows(exact.batch(5).x)[0], 0.0);
}

TEST(BatchSampler, Errors) {
  expect_error_containing([] { data::BatchSampler(iota_tokens(8), 8, 4, 1); }, "8 tokens", "seq + 1 = 9");
  data::BatchSampler s(iota_tokens(100), 8, 4, 1);
  EXPECT_THROW(s.batch(0, 3, 2), Error);
  EXPECT_THROW(s.batch(0, 0, 0), Error);
  EXPECT_THROW(s.batch(-1), Error);
}

TEST(EvalWindows, NonOverlappingFromTheStart) {
  const int64_t seq = 9;
  data::Batch b = data::eval_windows(iota_tokens(100), seq, 3);
  EXPECT_EQ(b.x.shape(), (Shape{3, seq}));
  std::vector<double> x = rows(b.x), y = rows(b.y);
  for (int64_t k = 0; k < 3; ++k)
    for (int64_t t = 0; t < seq; ++t) {
      EXPECT_EQ(x[size_t(k * seq + t)], double(k * (seq + 1) + t));
      EXPECT_EQ(y[size_t(k * seq + t)], double(k * (seq + 1) + t + 1));
    }
  EXPECT_EQ(data::eval_windows(iota_tokens(100), seq, 10).x.size(0), 10);  // exactly fills the split
  expect_error_containing([] { data::eval_windows(iota_tokens(100), 9, 11); }, "asked for 11", "only 10");
}
