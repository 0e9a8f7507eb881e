// autograd::checkpoint: gradients equal (bitwise) to running the region normally, parameters' gradient-ready
// hooks fire exactly once per backward, and the recomputation sees the forward's autocast state.
#include <gtest/gtest.h>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/rng.h"

using namespace minidl;

namespace {

Tensor randn(const Shape& shape, uint64_t seed, bool requires_grad) {
  std::vector<double> v(size_t(shape.numel()));
  Philox rng(seed, 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng.normal(i);
  Tensor t = Tensor::from_vector(v, shape);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

struct Net {
  Tensor w1 = randn({16, 32}, 1, true), b1 = randn({32}, 2, true), w2 = randn({32, 16}, 3, true);
  Tensor ln_w = randn({16}, 4, true), ln_b = randn({16}, 5, true);
  // A residual MLP with dropout: x + dropout(linear(bias_gelu(x @ w1, b1), w2)), then layernorm.
  Tensor region(const Tensor& x) const {
    Tensor h = bias_gelu(matmul(x, w1), b1);
    return layernorm(x + dropout(linear(h, w2, Tensor()), 0.2, 7, 1, 0), ln_w, ln_b);
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, ln_w, ln_b}; }
  void zero() const {
    for (Tensor p : params()) p.set_grad(Tensor());
  }
};

std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> g;
  for (const Tensor& t : ts) g.push_back(t.grad().to_vector());
  return g;
}

}  // namespace

TEST(Checkpoint, GradientsAreBitwiseEqualToNoCheckpoint) {
  Net net;
  Tensor x = randn({3, 5, 16}, 9, true);
  auto run = [&](bool ckpt) {
    net.zero();
    x.set_grad(Tensor());
    Tensor y =
        ckpt ? autograd::checkpoint([&](const Tensor& in) { return net.region(in); }, x, net.params()) : net.region(x);
    sum(square(y)).backward();
    std::vector<Tensor> all = net.params();
    all.push_back(x);
    return grads_of(all);
  };
  auto plain = run(false), ckpt = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], ckpt[i]) << "tensor " << i;
}

TEST(Checkpoint, ForwardSavesNothingButTheInputs) {
  Net net;
  Tensor x = randn({3, 5, 16}, 9, true);
  Tensor y = autograd::checkpoint([&](const Tensor& in) { return net.region(in); }, x, net.params());
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "checkpoint");
  // The node's edges: the input, then every listed parameter — nothing of the region's inner graph.
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 1 + net.params().size());
}

TEST(Checkpoint, ParameterHooksFireOncePerBackward) {
  Net net;
  std::vector<int> fired(net.params().size(), 0);
  std::vector<Tensor> params = net.params();
  for (size_t i = 0; i < params.size(); ++i) params[i].register_grad_ready_hook([&fired, i](Tensor&) { ++fired[i]; });
  Tensor x = randn({2, 4, 16}, 11, true);
  // Two checkpointed regions sharing every parameter, plus a use outside: the hooks must still fire once, after
  // all three contributions are summed.
  auto region = [&](const Tensor& in) { return net.region(in); };
  Tensor y = autograd::checkpoint(region, autograd::checkpoint(region, x, params), params);
  sum(y + net.region(x)).backward();
  for (size_t i = 0; i < fired.size(); ++i) EXPECT_EQ(fired[i], 1) << "parameter " << i;

  // And the gradient is the full sum: compare with the same graph without checkpointing (three contributions
  // may be added in another order: equal to rounding).
  std::vector<std::vector<double>> ckpt = grads_of(params);
  net.zero();
  sum(net.region(net.region(x)) + net.region(x)).backward();
  std::vector<std::vector<double>> plain = grads_of(params);
  for (size_t p = 0; p < plain.size(); ++p)
    for (size_t i = 0; i < plain[p].size(); ++i)
      ASSERT_NEAR(ckpt[p][i], plain[p][i], 1e-5 * (1 + std::abs(plain[p][i]))) << "parameter " << p << " element " << i;
}

TEST(Checkpoint, MultipleOutputsAndInputsThatNeedNoGradient) {
  Tensor a = randn({4, 6}, 1, true), b = randn({4, 6}, 2, false);
  Tensor w = randn({6, 6}, 3, true);
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], w) * in[1], tanh(in[0])}; };
  std::vector<Tensor> outs = autograd::checkpoint(fn, {a, b}, {w});
  sum(outs[0] + outs[1] * 3.0).backward();
  std::vector<std::vector<double>> ckpt = grads_of({a, w});
  EXPECT_FALSE(b.grad().defined());
  a.set_grad(Tensor());
  w.set_grad(Tensor());
  std::vector<Tensor> plain = fn({a, b});
  sum(plain[0] + plain[1] * 3.0).backward();
  EXPECT_EQ(grads_of({a, w}), ckpt);
}

TEST(Checkpoint, RecomputationRunsUnderTheForwardsAutocastState) {
  Net net;
  Tensor x = randn({2, 4, 16}, 13, true);
  auto run = [&](bool ckpt) {
    net.zero();
    Tensor loss;
    {
      autograd::AutocastGuard amp(DType::bf16);
      Tensor y = ckpt ? autograd::checkpoint([&](const Tensor& in) { return net.region(in); }, x, net.params())
                      : net.region(x);
      loss = sum(y);
    }
    loss.backward();  // outside the guard: the recomputation must still run in bf16
    return grads_of(net.params());
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(Checkpoint, NoGradModeJustRunsTheFunction) {
  Net net;
  Tensor x = randn({2, 4, 16}, 13, true);
  autograd::NoGradGuard no_grad;
  Tensor y = autograd::checkpoint([&](const Tensor& in) { return net.region(in); }, x, net.params());
  EXPECT_FALSE(y.grad_fn());
}
