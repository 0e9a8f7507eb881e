// add_layernorm (the residual add fused into the layernorm that reads it) against its oracles: on the CPU the same
// bits as `a + b` followed by layernorm, forward and backward, in f32 and under bf16/f16 autocast, whichever of its
// outputs carry gradient; and its gradients by central finite differences in float64.
#include <gtest/gtest.h>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/nn_test_util.h"
#include "support/gradcheck.h"

namespace minidl::testing {
namespace {

using autograd::AutocastGuard;

Tensor param(const Shape& shape, uint64_t seed, double scale = 1.0) {
  return random_tensor(shape, seed, DType::f32, scale).set_requires_grad(true);
}

std::vector<double> grad_values(const Tensor& t) { return t.grad().to_vector(); }

// Which outputs the loss reads: both (the GPT block), only the normalised one, only the sum.
enum class Uses { kBoth, kY, kSum };

struct Outcome {
  std::vector<double> sum, y, ga, gb, gw, gbias;
};

// a, b come out of a linear layer (so that under autocast they are 16-bit and have history); the loss reads the
// outputs through f32 weights R1, R2 as a GPT block would (the sum feeds the residual stream, y a matmul).
Outcome run_graph(bool fused, DType amp, Uses uses) {
  Tensor x = param({3, 4, 8}, 1), wa = param({8, 12}, 2, 0.5), wb = param({8, 12}, 3, 0.5);
  Tensor w = param({12}, 4), bias = param({12}, 5), r1 = param({12, 5}, 6),
         r2 = random_tensor({3, 4, 12}, 7, DType::f32);
  Outcome out;
  {
    AutocastGuard guard(amp);
    Tensor a = matmul(x, wa), b = matmul(x, wb);
    Tensor s, y;
    if (fused) {
      AddLayerNorm f = add_layernorm(a, b, w, bias);
      s = f.sum;
      y = f.y;
    } else {
      s = a + b;
      y = layernorm(s, w, bias);
    }
    Tensor loss_y = sum(matmul(y, r1)), loss_s = sum(s * autograd::autocast_to(r2, s.dtype()));
    Tensor loss = uses == Uses::kBoth ? loss_y + loss_s : uses == Uses::kY ? loss_y : loss_s;
    loss.backward();
    out.sum = s.to_vector();
    out.y = y.to_vector();
  }
  out.ga = grad_values(wa);
  out.gb = grad_values(wb);
  if (uses != Uses::kSum) {
    out.gw = grad_values(w);
    out.gbias = grad_values(bias);
  } else {
    EXPECT_FALSE(w.grad().defined());
  }
  return out;
}

TEST(AddLayerNorm, BitwiseEqualToAddThenLayerNormOnTheCpu) {
  for (DType amp : {DType::f32, DType::bf16, DType::f16})
    for (Uses uses : {Uses::kBoth, Uses::kY, Uses::kSum}) {
      SCOPED_TRACE(std::string(dtype_name(amp)) + " uses " + std::to_string(int(uses)));
      const Outcome fused = run_graph(true, amp, uses), unfused = run_graph(false, amp, uses);
      EXPECT_EQ(fused.sum, unfused.sum);
      EXPECT_EQ(fused.y, unfused.y);
      EXPECT_EQ(fused.ga, unfused.ga);
      EXPECT_EQ(fused.gb, unfused.gb);
      EXPECT_EQ(fused.gw, unfused.gw);
      EXPECT_EQ(fused.gbias, unfused.gbias);
    }
}

TEST(AddLayerNorm, OutputDtypesFollowTheInputs) {
  Tensor w = param({8}, 1), bias = param({8}, 2);
  for (DType dt : {DType::bf16, DType::f16}) {
    AutocastGuard amp(dt);
    Tensor a = random_tensor({2, 8}, 3, dt), b = random_tensor({2, 8}, 4, dt);
    AddLayerNorm f = add_layernorm(a, b, w, bias);
    EXPECT_EQ(f.sum.dtype(), dt);
    EXPECT_EQ(f.y.dtype(), dt);
    // Mixed dtypes promote like `a + b`: f32 out.
    AddLayerNorm mixed = add_layernorm(a, random_tensor({2, 8}, 5, DType::f32), w, bias);
    EXPECT_EQ(mixed.sum.dtype(), DType::f32);
    EXPECT_EQ(mixed.y.dtype(), DType::f32);
  }
}

// Both outputs into one f64 tensor, so that the finite differences see the gradient through each.
TEST(AddLayerNorm, GradientsMatchFiniteDifferencesInF64) {
  Tensor a = randn64({3, 7}, 1, 2.0).set_requires_grad(true), b = randn64({3, 7}, 2).set_requires_grad(true);
  Tensor w = randn64({7}, 3).set_requires_grad(true), bias = randn64({7}, 4).set_requires_grad(true);
  Tensor mix = randn64({3, 7}, 5);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        AddLayerNorm f = add_layernorm(in[0], in[1], in[2], in[3]);
        return f.y + f.sum * mix;
      },
      {a, b, w, bias});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return add_layernorm(in[0], in[1], in[2], in[3]).y; },
                         {a, b, w, bias});
}

TEST(AddLayerNorm, BadInputsNameExpectedAndGot) {
  Tensor w = Tensor::ones({5}), bias = Tensor::zeros({5});
  expect_error(
      [&] {
        add_layernorm(Tensor::zeros({2, 5}), Tensor::zeros({3, 5}), w, bias);
      },
      {"add_layernorm", "b of shape (2, 5)", "got (3, 5)"});
  expect_error(
      [&] {
        add_layernorm(Tensor::zeros({2, 5}), Tensor::zeros({2, 5}), Tensor::ones({4}), bias);
      },
      {"add_layernorm", "weight of shape (5,)", "got (4,)"});
}

}  // namespace
}  // namespace minidl::testing
