// Dropout: the documented Philox mapping (which the CUDA kernel must reproduce), reproducibility per
// (seed, stream, offset), the kept fraction, scaling, identity at p = 0, a gradient check and bad p.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/rng.h"
#include "ops/dropout.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

TEST(Dropout, FollowsThePhiloxMappingAndScales) {
  const int64_t n = 1003;  // not a multiple of 8: the last draw is partly used
  const double p = 0.3;
  const uint64_t seed = 42, stream = 5, offset = 1000;
  Tensor x = random_tensor({17, 59}, 40, DType::f32);
  Values xv = x.to_vector(), y = ops::dropout(x, p, seed, stream, offset).to_vector();
  ASSERT_EQ(int64_t(y.size()), n);
  Philox rng(seed, stream);
  float scale = 1.0f / (1.0f - float(p));
  // Written out from the documented mapping (ops/kernels/dropout.h), not with its helper: 16-bit half i % 2 of
  // word (i / 2) % 4 of draw offset + i / 8, kept iff >= ceil(p 2^16).
  const uint32_t threshold = uint32_t(std::ceil(double(float(p)) * 65536.0));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = rng.word(rng.draw(offset + uint64_t(i) / 8), int((i / 2) % 4));
    const uint32_t bits = i % 2 ? word >> 16 : word & 0xFFFFu;
    const bool keep = bits >= threshold;
    kept += keep;
    ASSERT_EQ(y[size_t(i)], keep ? double(float(xv[size_t(i)]) * scale) : 0.0) << "element " << i;
  }
  EXPECT_NEAR(double(kept) / double(n), 1 - p, 0.05);
}

TEST(Dropout, ReproducibleForSameCounterDifferentOtherwise) {
  Tensor x = Tensor::ones({4096});
  Values a = ops::dropout(x, 0.5, 1, 2, 3).to_vector();
  EXPECT_EQ(a, ops::dropout(x, 0.5, 1, 2, 3).to_vector());
  EXPECT_NE(a, ops::dropout(x, 0.5, 1, 2, 3 + 1024).to_vector());  // next call's offset
  EXPECT_NE(a, ops::dropout(x, 0.5, 1, 3, 3).to_vector());         // another stream
  EXPECT_NE(a, ops::dropout(x, 0.5, 2, 2, 3).to_vector());         // another seed
}

TEST(Dropout, KeptFractionIsOneMinusP) {
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.9}) {
    Values y = ops::dropout(Tensor::ones({n}), p, 7, 0, 0).to_vector();
    int64_t kept = 0;
    for (double v : y) kept += v != 0;
    // Binomial standard deviation is at most sqrt(0.25 / n) ~ 0.0011; allow ~5 of them.
    EXPECT_NEAR(double(kept) / n, 1 - p, 0.006) << "p = " << p;
  }
}

TEST(Dropout, ZeroProbabilityIsIdentity) {
  Tensor x = random_tensor({3, 5}, 41, DType::f32);
  EXPECT_EQ(dropout(x, 0.0, 1, 2, 3).to_vector(), x.to_vector());
  EXPECT_EQ(ops::dropout(x, 0.0, 1, 2, 3).to_vector(), x.to_vector());
}

TEST(Dropout, GradCheckF64) {
  Tensor x = random_tensor({3, 10}, 42, DType::f64);
  x.set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return dropout(in[0], 0.3, 9, 1, 17); }, {x});
  // The gradient is the same mask and scale as the forward.
  Values y = ops::dropout(x.detach(), 0.3, 9, 1, 17).to_vector(), xv = x.to_vector();
  x.set_grad(Tensor());
  dropout(x, 0.3, 9, 1, 17).backward(Tensor::ones({3, 10}, DType::f64));
  Values gv = x.grad().to_vector();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_DOUBLE_EQ(gv[i] * xv[i], y[i]) << "element " << i;
}

TEST(Dropout, BadProbabilityNamesExpectedAndGot) {
  expect_error([] { ops::dropout(Tensor::ones({4}), 1.0, 0, 0, 0); }, {"[0, 1)", "got 1"});
  expect_error([] { ops::dropout(Tensor::ones({4}), -0.1, 0, 0, 0); }, {"[0, 1)", "got -0.1"});
}

TEST(Dropout, RejectsABadStep) {
  expect_error(
      [] {
        ops::dropout(Tensor::ones({4}), 0.1, 0, 0, 0, {Tensor::zeros({2}, DType::i64), 1});
      },
      {"the step as one i64", "(2,)"});
  expect_error(
      [] {
        ops::dropout(Tensor::ones({4}), 0.1, 0, 0, 0, {Tensor::zeros({1}, DType::f32), 1});
      },
      {"the step as one i64", "f32"});
}
