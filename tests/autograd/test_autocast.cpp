// Autocast: the dtype each op produces under the policy of autograd/autocast.h, f32 gradients for f32
// parameters, the per-guard weight cache, and f32 master weights that keep updates bf16 could not represent.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/cast.h"
#include "ops/matmul.h"
#include "optim/sgd.h"

using namespace minidl;
using autograd::AutocastGuard;

namespace {
Tensor param(const Shape& shape, double value) { return Tensor::full(shape, value).set_requires_grad(true); }
Tensor ramp(const Shape& shape, DType dt = DType::f32) {
  std::vector<double> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01 * double(i % 17) - 0.05;
  return Tensor::from_vector(v, shape, dt);
}
}  // namespace

TEST(Autocast, OpDtypesFollowThePolicy) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    Tensor w = param({8, 12}, 0.1), b = param({12}, 0.0), table = param({10, 8}, 0.2);
    Tensor ln_w = param({8}, 1.0), ln_b = param({8}, 0.0);
    Tensor x = ramp({2, 4, 8});
    AutocastGuard amp(half);
    EXPECT_EQ(linear(x, w, b).dtype(), half);
    EXPECT_EQ(matmul(x, w).dtype(), half);
    Tensor qkv = linear(x, w, b);  // (2, 4, 12): C = 4, 2 heads
    EXPECT_EQ(causal_attention(qkv, 2).dtype(), half);
    EXPECT_EQ(causal_attention(ramp({2, 4, 12}), 2).dtype(), half);  // f32 qkv is cast down
    Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3}, {3});
    Tensor e = embedding(table, ids);
    EXPECT_EQ(e.dtype(), half);
    EXPECT_EQ(gelu(e).dtype(), half);
    EXPECT_EQ(bias_gelu(e, ln_b).dtype(), half);  // the f32 bias follows x
    EXPECT_EQ(dropout(e, 0.5, 1, 2, 3).dtype(), half);
    EXPECT_EQ((e + e).dtype(), half);
    EXPECT_EQ((e + ramp({3, 8})).dtype(), DType::f32);  // mixed: promoted
    EXPECT_EQ(layernorm(e, ln_w, ln_b).dtype(), half);  // f32 math, rounded once to x's dtype
    EXPECT_EQ(layernorm(ramp({3, 8}), ln_w, ln_b).dtype(), DType::f32);
    EXPECT_EQ(softmax(e).dtype(), DType::f32);
    Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3});
    EXPECT_EQ(cross_entropy(e, targets).dtype(), DType::f32);
    EXPECT_EQ(sum(e).dtype(), DType::f32);
    EXPECT_EQ(mean(e, 0).dtype(), DType::f32);
    EXPECT_EQ(matmul(ramp({3, 3}, DType::f64), ramp({3, 3}, DType::f64)).dtype(), DType::f64);  // f64 left alone
    {
      AutocastGuard off(DType::f32);
      EXPECT_EQ(linear(x, w, b).dtype(), DType::f32);
    }
    EXPECT_EQ(linear(x, w, b).dtype(), half);
  }
  EXPECT_FALSE(autograd::autocast_enabled());
}

TEST(Autocast, ParametersGetF32GradientsCloseToFullPrecision) {
  Tensor w = Tensor::from_vector(ramp({8, 6}).to_vector(), {8, 6}).set_requires_grad(true);
  Tensor ln_w = param({8}, 1.0), ln_b = param({8}, 0.0);
  Tensor x = ramp({5, 8});
  auto run = [&](DType dt) {
    w.set_grad(Tensor());
    ln_w.set_grad(Tensor());
    {
      AutocastGuard amp(dt);
      sum(square(linear(layernorm(x, ln_w, ln_b), w, Tensor()))).backward();
    }
    return std::make_pair(w.grad(), ln_w.grad());
  };
  auto [gw32, gln32] = run(DType::f32);
  auto [gw16, gln16] = run(DType::bf16);
  ASSERT_EQ(gw16.dtype(), DType::f32);
  ASSERT_EQ(gln16.dtype(), DType::f32);
  std::vector<double> a = gw16.to_vector(), b = gw32.to_vector();
  double scale = 0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 3e-2 * scale) << i;
}

// The weight gradient of a 16-bit product is the GEMM's f32 accumulation itself (ops::matmul_f32), not a 16-bit
// gradient cast up: it equals X^T G computed in f32 on the 16-bit values, and differs from that product rounded.
TEST(Autocast, WeightGradientsAreAccumulatedInF32ByTheGemm) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    Tensor w = Tensor::from_vector(ramp({8, 6}).to_vector(), {8, 6}).set_requires_grad(true);
    Tensor b = param({6}, 0.1);
    Tensor x = ramp({2, 5, 8}), g = ramp({2, 5, 6});
    std::vector<double> x16, g16;
    for (int use_linear = 0; use_linear < 2; ++use_linear) {
      w.set_grad(Tensor());
      {
        AutocastGuard amp(half);
        Tensor y = use_linear ? linear(x, w, b) : matmul(x, w);
        ASSERT_EQ(y.dtype(), half);
        autograd::backward({y}, {Tensor::from_vector(g.to_vector(), g.shape(), half)});
      }
      ASSERT_EQ(w.grad().dtype(), DType::f32);
      // X^T G in f64 on the 16-bit values: what an f32 accumulation approximates to ~1e-7.
      const Tensor xh = Tensor::from_vector(x.to_vector(), {10, 8}, half),
                   gh = Tensor::from_vector(g.to_vector(), {10, 6}, half);
      const Tensor want = ops::matmul(ops::cast(xh, DType::f64), ops::cast(gh, DType::f64), true, false);
      const std::vector<double> got = w.grad().to_vector(), exact = want.to_vector();
      const std::vector<double> rounded = ops::cast(ops::cast(want, half), DType::f64).to_vector();
      bool differs_from_rounded = false;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], exact[i], 1e-6 * (1 + std::abs(exact[i]))) << i;
        differs_from_rounded |= got[i] != rounded[i];
      }
      EXPECT_TRUE(differs_from_rounded) << "the weight gradient was rounded to " << dtype_name(half);
    }
  }
}

TEST(Autocast, WeightsAreCastOncePerGuardAndChargedToParams) {
  Tensor w = param({64, 64}, 0.5);
  Tensor x = ramp({4, 64});
  const int64_t params_before = ledger().current(MemTag::kParams);
  {
    AutocastGuard amp(DType::bf16);
    Tensor y1 = matmul(x, w);
    EXPECT_EQ(autograd::autocast_cached_weights(), 1);
    EXPECT_EQ(ledger().current(MemTag::kParams) - params_before, 64 * 64 * 2);
    Tensor y2 = matmul(x, w);  // a second use (another micro-batch, a recomputation): the same copy
    EXPECT_EQ(autograd::autocast_cached_weights(), 1);
    EXPECT_EQ(ledger().current(MemTag::kParams) - params_before, 64 * 64 * 2);
    (sum(y1) + sum(y2)).backward();  // both uses backpropagate through the cached copy
  }
  EXPECT_EQ(autograd::autocast_cached_weights(), 0);
  EXPECT_EQ(ledger().current(MemTag::kParams), params_before);
  // d sum(x w) / dw[k][j] = sum_i x[i][k], twice.
  std::vector<double> xs = x.to_vector(), g = w.grad().to_vector();
  for (int k = 0; k < 64; ++k) {
    double col = 0;
    for (int i = 0; i < 4; ++i) col += double(to_float(to_bf16(float(xs[size_t(i * 64 + k)]))));
    ASSERT_NEAR(g[size_t(k * 64)], 2 * col, 1e-2 * std::abs(col)) << k;  // each use's gradient is bf16
  }
}

TEST(Autocast, F32MasterWeightsAccumulateUpdatesBelowBf16Resolution) {
  // Each step moves p by 1e-4; bf16's spacing at 1.0 is 2^-7 (0.0078), so rounding a bf16 weight to nearest
  // after each update would leave it at 1.0 forever.
  Tensor p = param({1, 1}, 1.0);
  optim::SGD sgd({{{p}, 0.0}}, {.lr = 1e-4});
  Tensor x = Tensor::ones({1, 1});
  float bf16_weight = 1.0f;
  for (int step = 0; step < 1000; ++step) {
    {
      AutocastGuard amp(DType::bf16);
      sum(matmul(x, p)).backward();  // dloss/dp = 1
    }
    sgd.step();
    sgd.zero_grad();
    bf16_weight = to_float(to_bf16(bf16_weight - 1e-4f));
  }
  EXPECT_NEAR(p.item(), 0.9, 1e-4);
  EXPECT_EQ(bf16_weight, 1.0f);
}

TEST(Autocast, RejectsOtherDtypes) {
  EXPECT_THROW(AutocastGuard(DType::f64), Error);
  EXPECT_THROW(AutocastGuard(DType::i32), Error);
}
