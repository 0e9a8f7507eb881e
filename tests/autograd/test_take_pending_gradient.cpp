// Gradient-sum fusion (autograd::take_pending_gradient): a backward function takes the gradient other nodes already
// sent to one of its inputs and adds it in its own pass, as layer norm's backward does on the CPU with the residual
// stream's. The oracles: the engine's own sum (the same graph with the fusion's consumer made to run first, so that
// nothing is pending yet), and each branch's gradient from grad() added with ops::add, bit for bit.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/parallel.h"
#include "ops/elementwise.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::uniform;

// y = x * k, whose backward takes what is pending for x and adds it to k g; `taken` says whether anything was.
Tensor scaled_taking(const Tensor& x, double k, bool& taken) {
  return autograd::record("scaled_taking", {x}, ops::mul(x.detach(), k), [k, &taken](const Tensor& g) {
    Tensor mine = ops::mul(g, k);
    Tensor other = autograd::take_pending_gradient(0);
    taken = other.defined();
    return std::vector<Tensor>{taken ? ops::add(mine, other) : mine};
  });
}

TEST(TakePendingGradient, TakesWhatOtherNodesSentAndTheEngineDeliversTheSum) {
  Tensor x = uniform({5}, 1, DType::f32).set_requires_grad(true);
  bool taken = false;
  // Created first, so run last: x's other use (created after it) has delivered 3 g by then.
  Tensor a = scaled_taking(x, 2.0, taken);
  Tensor b = mul(x, 3.0);
  sum(add(a, b)).backward();
  EXPECT_TRUE(taken);
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(5, 5.0));

  // Created last, so run first: nothing pending; the engine sums the two as usual.
  x.set_grad(Tensor());
  Tensor b2 = mul(x, 3.0);
  Tensor a2 = scaled_taking(x, 2.0, taken);
  sum(add(a2, b2)).backward();
  EXPECT_FALSE(taken);
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(5, 5.0));

  // grad() with x as an input: what is pending in its captured slot is taken and given back the same way.
  Tensor a3 = scaled_taking(x, 2.0, taken);
  Tensor b3 = mul(x, 3.0);
  std::vector<Tensor> g = autograd::grad({sum(add(a3, b3))}, {}, {x});
  EXPECT_TRUE(taken);
  EXPECT_EQ(g[0].to_vector(), std::vector<double>(5, 5.0));

  // Outside a backward pass nothing is pending.
  EXPECT_FALSE(autograd::take_pending_gradient(0).defined());
}

// A block's shape: x feeds ln_1 (created first) and the add before ln_2 (created after it), so ln_1's backward finds
// the residual gradient pending and adds it in its own pass. x's gradient equals its two parts computed apart (each
// with the other use detached, so nothing is pending) and summed by ops::add, bit for bit, in f32 and f64, on 1 and
// 2 threads. x is a non-leaf, as the residual stream is.
TEST(TakePendingGradient, LayerNormAddsTheResidualGradientWithTheEnginesBits) {
  const int saved = num_threads();
  for (DType dt : {DType::f32, DType::f64})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << ", " << threads << " threads");
      const Shape s{6, 40, 37};
      Tensor x0 = uniform(s, 2, dt).set_requires_grad(true);
      Tensor w1 = uniform({37}, 3, dt), b1 = uniform({37}, 4, dt), w2 = uniform({37}, 5, dt), b2 = uniform({37}, 6, dt);
      Tensor c1 = uniform(s, 7, dt), c2 = uniform(s, 8, dt);
      // loss(x through ln_1, x as the residual): the block's ln_1 -> branch -> add + ln_2.
      const auto loss = [&](const Tensor& x_ln1, const Tensor& x_residual) {
        Tensor branch = mul(layernorm(x_ln1, w1, b1, 1e-5), c1);
        const AddLayerNorm y = add_layernorm(x_residual, branch, w2, b2, 1e-5);
        return add(sum(mul(y.y, c2)), sum(y.sum));
      };
      Tensor x = mul(x0, 1.0);
      const Tensor fused = autograd::grad({loss(x, x)}, {}, {x0})[0];
      x = mul(x0, 1.0);
      const Tensor through_ln1 = autograd::grad({loss(x, x.detach())}, {}, {x0})[0];
      x = mul(x0, 1.0);
      const Tensor through_residual = autograd::grad({loss(x.detach(), x)}, {}, {x0})[0];
      EXPECT_EQ(fused.to_vector(), ops::add(through_residual, through_ln1).to_vector());
    }
  set_num_threads(saved);
}

}  // namespace
}  // namespace minidl
