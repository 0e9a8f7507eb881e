#include <gtest/gtest.h>

#include <cmath>

#include "core/memory.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/adamw.h"
#include "optim/adamw.h"

using namespace minidl;

// The textbook AdamW step in double: the oracle for the fused f32 kernel.
struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd, int64_t t) {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double m_hat = m[i] / (1 - std::pow(b1, double(t))), v_hat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

static std::vector<double> normals(int64_t n, uint64_t seed, double scale) {
  std::vector<double> out(static_cast<size_t>(n));
  Philox rng(seed, 7);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = scale * rng.normal(uint64_t(i));
  return out;
}

// |got - ref| <= rel * |ref| + abs, elementwise.
static void expect_close(const Tensor& t, const std::vector<double>& ref, double rel, double abs, const char* what) {
  std::vector<double> got = t.to_vector();
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], rel * std::abs(ref[i]) + abs) << what << "[" << i << "]";
}

class FusedAdamW : public ::testing::TestWithParam<double> {};

// Several steps over a buffer big enough to be split across threads, against the double reference.
TEST_P(FusedAdamW, MatchesScalarReferenceOverSteps) {
  const double wd = GetParam(), lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const int64_t n = 50000;
  RefAdamW ref{normals(n, 1, 1.0), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  Tensor p = Tensor::from_vector(ref.p, {n}), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  ref.p = p.to_vector();  // start from the f32-rounded values
  for (int64_t t = 1; t <= 5; ++t) {
    Tensor g = Tensor::from_vector(normals(n, 100 + uint64_t(t), 0.1), {n});
    ref.step(g.to_vector(), lr, b1, b2, eps, wd, t);
    ops::fused_adamw_(p, g, m, v, {lr, b1, b2, eps, wd, t});
  }
  // p is O(1) and moves by about lr per step, so its f32 rounding error is absolute, not relative to p.
  expect_close(p, ref.p, 1e-5, 1e-6, "p");
  expect_close(m, ref.m, 1e-5, 1e-8, "m");  // m can cancel to near 0: absolute slack at the scale of g
  expect_close(v, ref.v, 1e-5, 1e-11, "v");
}
INSTANTIATE_TEST_SUITE_P(WeightDecay, FusedAdamW, ::testing::Values(0.0, 0.1));

// At t = 1 the bias correction makes m_hat = g and v_hat = g^2: the step is lr * g / (|g| + eps) after decay.
TEST(FusedAdamWStep, FirstStepIsSignLikeAfterDecay) {
  const double lr = 0.1, wd = 0.5;
  Tensor p = Tensor::from_vector(std::vector<double>{1.0, -2.0, 3.0}, {3});
  Tensor g = Tensor::from_vector(std::vector<double>{0.5, -4.0, 1e-3}, {3});
  Tensor m = Tensor::zeros({3}), v = Tensor::zeros({3});
  ops::fused_adamw_(p, g, m, v, {.lr = lr, .weight_decay = wd, .step = 1});
  std::vector<double> p0{1.0, -2.0, 3.0}, g0{0.5, -4.0, 1e-3};
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(p.to_vector()[i], p0[i] * (1 - lr * wd) - lr * g0[i] / (std::abs(g0[i]) + 1e-8), 1e-6);
}

// Reference numbers from PyTorch 1.13 (Debian python3-torch), produced with:
//   p = torch.tensor([0.5, -1.25, 2.0], requires_grad=True)
//   opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
//   for g in [[0.1, -0.2, 0.3], [-0.4, 0.5, 0.05], [0.25, 0.0, -0.6]]: p.grad = torch.tensor(g); opt.step()
// printing p, state["exp_avg"], state["exp_avg_sq"] with "%.9g".
TEST(AdamW, MatchesPyTorchOnATinyCase) {
  const std::vector<std::vector<double>> grads{{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.05}, {0.25, 0.0, -0.6}};
  const std::vector<double> m_torch{-0.00290000066, 0.0287999976, -0.031200001};
  const std::vector<double> v_torch{0.000232320046, 0.000289670046, 0.000452317618};
  const std::vector<std::pair<double, std::vector<double>>> p_torch{{0.0, {0.495979398, -1.24784052, 1.98513031}},
                                                                    {0.1, {0.494495302, -1.24410987, 1.97916424}}};
  for (const auto& [wd, p_expected] : p_torch) {
    Tensor p = Tensor::from_vector(std::vector<double>{0.5, -1.25, 2.0}, {3});
    p.set_requires_grad(true);
    optim::AdamW opt({{{p}, wd}}, {.lr = 0.01});
    for (const auto& g : grads) {
      p.set_grad(Tensor::from_vector(g, {3}));
      opt.step();
    }
    expect_close(p, p_expected, 1e-6, 0.0, "p");
    expect_close(opt.state().m, m_torch, 1e-6, 0.0, "m");
    expect_close(opt.state().v, v_torch, 1e-6, 0.0, "v");
    EXPECT_EQ(opt.state().step, 3);
  }
}

static Tensor param(const Shape& shape, double value) {
  Tensor p = Tensor::full(shape, value);
  p.set_requires_grad(true);
  p.set_grad(Tensor::zeros(shape));
  return p;
}

TEST(AdamW, StateIsFlatAndChargedToTheOptimizerTag) {
  // 48 floats = 192 bytes, a multiple of the allocator's 64-byte rounding, so the ledger delta is exact.
  Tensor w = param({4, 8}, 1.0), b = param({16}, 1.0);
  int64_t before = ledger().current(MemTag::kOptimizer);
  optim::AdamW opt({{{w, b}, 0.0}});
  EXPECT_EQ(opt.numel(), 48);
  EXPECT_EQ(ledger().current(MemTag::kOptimizer) - before, 2 * 48 * int64_t(sizeof(float)));
  EXPECT_EQ(opt.state().m.shape(), (Shape{48}));
  EXPECT_EQ(opt.state().v.shape(), (Shape{48}));
}

// With zero gradients the Adam term is 0, so only decoupled decay moves a parameter: matrices decay, biases don't.
TEST(AdamW, DecayGroupsDecayOnlyMatrices) {
  Tensor w = param({2, 3}, 1.0), b = param({3}, 1.0);
  optim::AdamW opt(optim::decay_groups({{"fc.weight", w}, {"fc.bias", b}}, 0.1), {.lr = 0.5});
  opt.step();
  for (double x : w.to_vector()) EXPECT_FLOAT_EQ(x, 1.0 - 0.5 * 0.1);
  for (double x : b.to_vector()) EXPECT_FLOAT_EQ(x, 1.0);
}

TEST(AdamW, LoadStateResumesExactly) {
  auto run = [](optim::AdamW& opt, Tensor& p, int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      p.set_grad(Tensor::from_vector(normals(6, 50 + uint64_t(t), 1.0), {2, 3}));
      opt.step();
    }
  };
  Tensor a = param({2, 3}, 0.5), b = param({2, 3}, 0.0);
  optim::AdamW opt_a({{{a}, 0.1}}), opt_b({{{b}, 0.1}});
  run(opt_a, a, 0, 3);
  b.copy_(a);
  optim::AdamWState saved = opt_a.state();
  opt_b.load_state({saved.step, saved.m.clone(), saved.v.clone()});
  run(opt_a, a, 3, 5);
  run(opt_b, b, 3, 5);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  EXPECT_EQ(opt_b.state().step, 5);
  EXPECT_THROW(opt_b.load_state({1, Tensor::zeros({5}), Tensor::zeros({5})}), Error);
}

TEST(AdamW, SkipsAParameterWithoutGradient) {
  Tensor a = Tensor::ones({2}).set_requires_grad(true), b = Tensor::ones({3}).set_requires_grad(true);
  optim::AdamW opt({{{a, b}, 0.1}}, {.lr = 0.5});
  b.set_grad(Tensor::full({3}, 2.0));
  opt.step();
  EXPECT_EQ(a.to_vector(), std::vector<double>(2, 1.0)) << "no weight decay on a parameter without a gradient";
  EXPECT_EQ(opt.state().m.narrow(0, 0, 2).to_vector(), std::vector<double>(2, 0.0)) << "no moment update";
  EXPECT_NE(b.to_vector(), std::vector<double>(3, 1.0));
}

TEST(AdamW, Errors) {
  Tensor p = Tensor::ones({3});
  EXPECT_THROW(optim::AdamW({{{p}, 0.0}}), Error);  // does not require grad
  p.set_requires_grad(true);
  EXPECT_THROW(optim::AdamW({{{p}, 0.0}}, {.beta1 = 1.0}), Error);
  optim::AdamW opt({{{p}, 0.0}});
  opt.step();  // no gradient yet: the parameter is skipped (no decay, no moments), as in PyTorch
  EXPECT_EQ(p.to_vector(), std::vector<double>(3, 1.0));
  EXPECT_THROW(ops::fused_adamw_(p, Tensor::zeros({4}), Tensor::zeros({3}), Tensor::zeros({3}), {}), Error);
  EXPECT_THROW(ops::fused_adamw_(p, Tensor::zeros({3}), Tensor::zeros({3}), Tensor::zeros({3}), {.step = 0}), Error);
}

// The CPU multi-tensor update runs all tensors in one parallel pass; each element must get the bits of the
// one-tensor update, whatever the tensor sizes (below and above the grain, empty) and the thread count.
TEST(FusedAdamWMulti, EqualsOneTensorAtATimeAtAnyThreadCount) {
  const int saved = num_threads();
  const std::vector<int64_t> sizes = {1, 0, 100, 40000, 3, 70001};
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<Tensor> p, g, m, v, p1, m1, v1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      p.push_back(Tensor::from_vector(normals(sizes[i], 10 + i, 1.0), {sizes[i]}));
      g.push_back(Tensor::from_vector(normals(sizes[i], 20 + i, 0.1), {sizes[i]}));
      m.push_back(Tensor::from_vector(normals(sizes[i], 30 + i, 0.01), {sizes[i]}));
      std::vector<double> second = normals(sizes[i], 40 + i, 0.001);
      for (double& x : second) x = std::abs(x);  // v >= 0
      v.push_back(Tensor::from_vector(second, {sizes[i]}));
      p1.push_back(p.back().clone());
      m1.push_back(m.back().clone());
      v1.push_back(v.back().clone());
    }
    const ops::AdamWHyper h{1e-2, 0.9, 0.999, 1e-8, 0.1, 3};
    ops::fused_adamw_multi_(p, g, m, v, h);
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] > 0) ops::fused_adamw_(p1[i], g[i], m1[i], v1[i], h);
      EXPECT_EQ(p[i].to_vector(), p1[i].to_vector()) << threads << " threads, tensor " << i;
      EXPECT_EQ(m[i].to_vector(), m1[i].to_vector()) << threads << " threads, tensor " << i;
      EXPECT_EQ(v[i].to_vector(), v1[i].to_vector()) << threads << " threads, tensor " << i;
    }
  }
  set_num_threads(saved);
}

// step_and_zero_grad zeroes the gradients in the update's pass: the same parameters and moments, bit for bit, as
// step() then zero_grad(), over two groups (decayed, not), a parameter without a gradient, sizes below and above a
// thread's share, on 1 and 2 threads; and the gradients all zero after it.
TEST(AdamW, StepAndZeroGradEqualsStepThenZeroGrad) {
  const int saved = num_threads();
  const std::vector<int64_t> sizes = {5, 40000, 70001, 3};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<Tensor> fused, plain;
    for (size_t i = 0; i < sizes.size(); ++i) {
      fused.push_back(Tensor::from_vector(normals(sizes[i], 50 + i, 1.0), {sizes[i]}).set_requires_grad(true));
      plain.push_back(fused.back().detach().clone().set_requires_grad(true));
    }
    optim::AdamW opt_fused({{{fused[0], fused[1]}, 0.1}, {{fused[2], fused[3]}, 0.0}}, {.lr = 1e-2});
    optim::AdamW opt_plain({{{plain[0], plain[1]}, 0.1}, {{plain[2], plain[3]}, 0.0}}, {.lr = 1e-2});
    for (int64_t t = 1; t <= 3; ++t) {
      for (size_t i = 0; i + 1 < sizes.size(); ++i) {  // the last parameter never gets a gradient
        Tensor g = Tensor::from_vector(normals(sizes[i], 60 + 10 * uint64_t(t) + i, 0.1), {sizes[i]});
        fused[i].set_grad(g.clone());
        plain[i].set_grad(g.clone());
      }
      opt_fused.step_and_zero_grad();
      opt_plain.step();
      opt_plain.zero_grad();
      for (size_t i = 0; i < sizes.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, step " << t << ", parameter " << i);
        EXPECT_EQ(fused[i].to_vector(), plain[i].to_vector());
        if (i + 1 < sizes.size()) EXPECT_EQ(fused[i].grad().to_vector(), std::vector<double>(size_t(sizes[i]), 0.0));
      }
      EXPECT_EQ(opt_fused.state().m.to_vector(), opt_plain.state().m.to_vector());
      EXPECT_EQ(opt_fused.state().v.to_vector(), opt_plain.state().v.to_vector());
    }
  }
  set_num_threads(saved);
}
