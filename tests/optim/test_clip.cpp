#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "core/rng.h"
#include "optim/clip.h"

using namespace minidl;

static Tensor with_grad(const std::vector<double>& g, DType dt = DType::f32) {
  Tensor p = Tensor::zeros({int64_t(g.size())}, dt);
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_vector(g, {int64_t(g.size())}, dt));
  return p;
}

TEST(ClipGradNorm, NormOfAllGradients) {
  std::vector<Tensor> params{with_grad({3.0, 4.0}), with_grad({12.0})};
  EXPECT_DOUBLE_EQ(optim::grad_norm_squared(params), 169.0);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(params, 100.0), 13.0);
  EXPECT_EQ(params[0].grad().to_vector(), (std::vector<double>{3.0, 4.0}));  // below max_norm: untouched
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  std::vector<Tensor> params{with_grad({3.0, 4.0}), with_grad({12.0}, DType::f64)};
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(params, 1.3), 13.0);  // returns the norm before clipping
  double f = 1.3 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(params[0].grad().to_vector()[1], float(4.0 * f));
  EXPECT_DOUBLE_EQ(params[1].grad().to_vector()[0], 12.0 * f);
  EXPECT_NEAR(std::sqrt(optim::grad_norm_squared(params)), 1.3, 1e-6);
}

TEST(ClipGradNorm, ManyBlocksMatchDirectSum) {
  std::vector<double> g(100003);
  Philox rng(3);
  for (size_t i = 0; i < g.size(); ++i) g[i] = rng.normal(i);
  std::vector<Tensor> params{with_grad(g), with_grad({0.5})};
  double direct = 0.25;
  for (double x : params[0].grad().to_vector()) direct += x * x;
  EXPECT_NEAR(optim::grad_norm_squared(params), direct, 1e-9 * direct);
}

// All gradients go through one parallel pass over fixed blocks of 2^14: the norm is the per-tensor, in-order sum
// of the blocks' sums (written out here), bit for bit, at every thread count.
TEST(ClipGradNorm, FixedBlocksGiveTheSameBitsAtAnyThreadCount) {
  std::vector<Tensor> params;
  for (int64_t n : {40000, 7, 16384, 100003}) {
    std::vector<double> g(static_cast<size_t>(n));
    Philox rng(static_cast<uint64_t>(n));
    for (size_t i = 0; i < g.size(); ++i) g[i] = rng.normal(i);
    params.push_back(with_grad(g));
  }
  double want = 0.0;
  for (const Tensor& p : params) {
    const std::vector<double> g = p.grad().to_vector();
    double tensor_total = 0.0;
    for (size_t b = 0; b < g.size(); b += 16384) {
      double lane[8] = {};  // element i of a block into partial sum i % 8, the eight added pairwise
      for (size_t i = b; i < std::min(g.size(), b + 16384); ++i) lane[(i - b) % 8] += g[i] * g[i];
      tensor_total += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
    want += tensor_total;
  }
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(optim::grad_norm_squared(params), want) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(ClipGradNorm, SkipsMissingGradientsAndChecksMaxNorm) {
  Tensor no_grad = Tensor::zeros({2});
  no_grad.set_requires_grad(true);
  std::vector<Tensor> params{no_grad, with_grad({0.0, 2.0})};
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(params, 1.0), 2.0);
  EXPECT_THROW(optim::clip_grad_norm(params, 0.0), Error);
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradientsAlone) {
  std::vector<Tensor> params{with_grad({INFINITY, 1.0})};
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm(params, 1.0)));
  EXPECT_EQ(params[0].grad().to_vector()[1], 1.0);
}
