// Gradient-accumulation fusion (autograd::accumulate_in_place): a backward function adds a leaf's gradient into
// .grad() itself, as linear's, matmul's and gelu_mlp's weight gradients do on the CPU (a GEMM with beta = 1). The
// oracles: the fresh gradient the same product gives (bitwise where .grad() starts at zero), the engine's own sum
// for a weight used twice, the memory ledger (no fresh weight-sized gradient), and grad(), which never touches
// .grad().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/memory.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::uniform;

// y = w * 2 elementwise, whose backward adds 2g into w.grad() itself where the pass allows; `in_place` says what
// accumulate_in_place answered.
Tensor doubled(const Tensor& w, bool& in_place) {
  Tensor wd = w.detach();
  return autograd::record("doubled", {w}, ops::mul(wd, 2.0), [w, &in_place](const Tensor& g) {
    Tensor g2 = ops::mul(g, 2.0);
    in_place = autograd::accumulate_in_place(w, [&](Tensor& grad) { ops::add_(grad, g2); });
    return std::vector<Tensor>{in_place ? Tensor() : g2};
  });
}

Tensor leaf(const Shape& s, uint64_t seed) { return uniform(s, seed, DType::f32).set_requires_grad(true); }

TEST(AccumulateInPlace, OnlyWhereTheGradExistsAndThePassAccumulates) {
  Tensor w = leaf({4}, 1);
  int hooks = 0;
  w.register_grad_ready_hook([&](Tensor&) { ++hooks; });
  bool in_place = true;
  sum(doubled(w, in_place)).backward();
  EXPECT_FALSE(in_place);  // no grad() yet: AccumulateGrad makes it
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(4, 2.0));
  sum(doubled(w, in_place)).backward();
  EXPECT_TRUE(in_place);
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(4, 4.0));
  EXPECT_EQ(hooks, 2);  // once per backward, in place or not

  // grad() with w as an input: w's node is captured, so nothing may go into w.grad().
  std::vector<Tensor> g = autograd::grad({sum(doubled(w, in_place))}, {}, {w});
  EXPECT_FALSE(in_place);
  EXPECT_EQ(g[0].to_vector(), std::vector<double>(4, 2.0));
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(4, 4.0));
  EXPECT_EQ(hooks, 2);

  // grad() with another input: w is a leaf the pass accumulates into.
  Tensor other = leaf({4}, 2);
  autograd::grad({sum(add(doubled(w, in_place), other))}, {}, {other});
  EXPECT_TRUE(in_place);
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(4, 6.0));

  // Outside a backward pass there is nothing to accumulate into.
  EXPECT_FALSE(autograd::accumulate_in_place(w, [](Tensor&) { ADD_FAILURE() << "ran outside a pass"; }));
}

TEST(AccumulateInPlace, ATiedLeafSumsBothUsesAndFiresItsHookOnce) {
  Tensor w = leaf({3}, 3);
  w.set_grad(Tensor::zeros({3}));
  int hooks = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](Tensor& g) {
    ++hooks;
    seen = g.to_vector();
  });
  bool in_place = false;
  // d/dw of sum(2w + w * c) = 2 + c: one use adds in place, the other arrives through the engine.
  Tensor c = uniform({3}, 4, DType::f32);
  sum(add(doubled(w, in_place), mul(w, c))).backward();
  EXPECT_TRUE(in_place);
  EXPECT_EQ(hooks, 1);
  const std::vector<double> cv = c.to_vector();
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(float(seen[i]), float(2.0 + cv[i]));
  EXPECT_EQ(seen, w.grad().to_vector());
}

// linear and gelu_mlp, f32 on the CPU: the first backward after zeroing gives the fresh GEMM's bits (0 + x = x),
// a second one adds to them, and a weight used by two layers gets both contributions (as grad() computes them,
// without accumulating in place).
TEST(AccumulateInPlace, LinearAndMlpWeightGradientsMatchTheFreshProduct) {
  const int64_t rows = 40, in = 48, hidden = 64;
  Tensor x = uniform({2, rows / 2, in}, 5, DType::f32);
  Tensor w = leaf({in, in}, 6), b = leaf({in}, 7), fc_w = leaf({in, hidden}, 8), fc_b = leaf({hidden}, 9),
         proj_w = leaf({hidden, in}, 10), proj_b = leaf({in}, 11);
  Tensor r = uniform({2, rows / 2, in}, 12, DType::f32);
  const std::vector<Tensor> params{w, b, fc_w, fc_b, proj_w, proj_b};
  // w used twice: linear(linear(x)), then the MLP.
  auto loss = [&] { return sum(mul(gelu_mlp(linear(linear(x, w, b), w, b), fc_w, fc_b, proj_w, proj_b), r)); };

  std::vector<Tensor> fresh = autograd::grad({loss()}, {}, params);  // captured: never in place
  for (Tensor p : params) p.set_grad(Tensor::zeros(p.shape()));
  loss().backward();
  // fc_w and proj_w have one use each: their in-place sums start from 0, so the bits are the fresh product's.
  EXPECT_EQ(fc_w.grad().to_vector(), fresh[2].to_vector());
  EXPECT_EQ(proj_w.grad().to_vector(), fresh[4].to_vector());
  // The tied w: the in-place sum is (0 + one use) + the other's terms, the engine's the two uses added: f32
  // rounding apart, on sums whose terms cancel (tolerance from the largest element).
  auto expect_near = [&](double times) {
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<double> got = params[i].grad().to_vector(), want = fresh[i].to_vector();
      double scale = 0;
      for (double v : want) scale = std::max(scale, std::abs(v));
      for (size_t j = 0; j < got.size(); ++j) ASSERT_NEAR(got[j], times * want[j], 1e-5 * times * (1 + scale)) << i;
    }
  };
  expect_near(1);
  loss().backward();
  expect_near(2);
}

// matmul of a batch by a 2-D weight (the CPU MLP's c_fc, x W_fc): the weight's gradient goes into .grad() (no
// fresh weight-sized gradient in the backward's memory: the ledger's peak), with the fresh product's bits after
// zeroing and about twice them after a second backward; both orientations of the weight.
TEST(AccumulateInPlace, MatmulWeightGradientGoesIntoGradWithTheFreshProductsBits) {
  const int64_t in = 256, hidden = 192;
  Tensor x = uniform({2, 3, in}, 16, DType::f32), r = uniform({2, 3, in}, 17, DType::f32);
  Tensor w = leaf({in, hidden}, 18), w_t = leaf({in, hidden}, 19);  // w_t multiplies as its transpose
  const std::vector<Tensor> params{w, w_t};
  auto loss = [&] { return sum(mul(matmul(matmul(x, w), w_t, false, true), r)); };

  std::vector<Tensor> fresh = autograd::grad({loss()}, {}, params);
  for (Tensor p : params) p.set_grad(Tensor::zeros(p.shape()));
  Tensor l = loss();
  ledger().reset_peaks();
  const int64_t before = ledger().current_total();
  l.backward();
  // The activations' gradients are 2 x 3 rows; one fresh (in, hidden) f32 gradient alone would be 192 KB.
  EXPECT_LT(ledger().peak_total() - before, in * hidden * int64_t(sizeof(float)) / 2);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].grad().to_vector(), fresh[i].to_vector()) << i;
  loss().backward();
  for (size_t i = 0; i < params.size(); ++i) {  // the GEMM's running sum from .grad(): f32 rounding apart
    const std::vector<double> got = params[i].grad().to_vector(), want = fresh[i].to_vector();
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t j = 0; j < got.size(); ++j) ASSERT_NEAR(got[j], 2 * want[j], 1e-5 * (1 + scale)) << i;
  }
}

TEST(MatmulAdd, AddsTheProductOrNamesWhatItExpected) {
  Tensor a = uniform({5, 7}, 13, DType::f64), bm = uniform({5, 3}, 14, DType::f64);
  Tensor out = uniform({7, 3}, 15, DType::f64);
  const std::vector<double> before = out.to_vector(), product = ops::matmul(a, bm, true, false).to_vector();
  ops::matmul_add_(out, a, bm, true, false);
  const std::vector<double> after = out.to_vector();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i] + product[i], 1e-12);
  Tensor wrong = Tensor::zeros({3, 7}, DType::f64);
  testing::expect_error_mentions([&] { ops::matmul_add_(wrong, a, bm, true, false); },
                                 {"matmul_add_", "(7, 3)", "(3, 7)"});
}

}  // namespace
}  // namespace minidl
