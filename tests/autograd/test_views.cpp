// Gradients through the differentiable views of autograd/views.cpp, composed with ops.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "tests/support/gradcheck.h"

namespace minidl {
namespace {

using testing::expect_gradients_match;
using testing::randn64;
using Inputs = std::vector<Tensor>;

TEST(ViewsGrad, ReshapeTransposeNarrowContiguous) {
  Tensor x = randn64({2, 3, 4}, 1).set_requires_grad(true);
  Tensor w = randn64({3, 2}, 2).set_requires_grad(true);
  expect_gradients_match([](const Inputs& in) { return in[0].reshape({6, 4}) * 2.0; }, {x});
  expect_gradients_match([](const Inputs& in) { return in[0].view({4, -1}); }, {x});
  expect_gradients_match([](const Inputs& in) { return square(in[0].transpose(0, 2)); }, {x});
  expect_gradients_match([](const Inputs& in) { return in[0].narrow(1, 1, 2).contiguous(); }, {x});
  expect_gradients_match([](const Inputs& in) { return in[0].narrow(-1, 0, 3).narrow(0, 1, 1); }, {x});
  // reshape of a non-viewable (transposed) tensor copies, then views.
  expect_gradients_match([](const Inputs& in) { return in[0].transpose(1, 2).reshape({-1}); }, {x});
  // A chain that feeds views into matmul with a broadcast multiply.
  expect_gradients_match(
      [](const Inputs& in) {
        return matmul(in[0].transpose(1, 2).narrow(1, 1, 2), in[1]) * in[0].narrow(1, 0, 2).narrow(2, 0, 2);
      },
      {x, w});
}

TEST(ViewsGrad, NarrowedGradientLandsInTheRightPlace) {
  Tensor x = Tensor::zeros({2, 3}, DType::f64).set_requires_grad(true);
  sum(mul(x.narrow(1, 1, 2), 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 3, 3, 0, 3, 3}));
}

// cat (a Llama's q|k|v): the parts side by side along any dimension, each part's gradient its own slice; parts of
// other shapes are refused naming both.
TEST(ViewsGrad, CatJoinsThePartsAndSplitsTheGradient) {
  Tensor a = randn64({2, 3, 4}, 3).set_requires_grad(true), b = randn64({2, 3, 2}, 4).set_requires_grad(true);
  Tensor c = randn64({2, 1, 4}, 5).set_requires_grad(true);
  expect_gradients_match([](const Inputs& in) { return square(cat({in[0], in[1], in[0]}, 2)); }, {a, b});
  expect_gradients_match([](const Inputs& in) { return cat({in[0], in[1]}, -2) * 2.0; }, {a, c});
  const Tensor joined = cat({a, b}, 2);
  EXPECT_EQ(joined.shape(), (Shape{2, 3, 6}));
  EXPECT_EQ(joined.narrow(2, 4, 2).contiguous().to_vector(), b.to_vector());
  EXPECT_THROW(cat({a, c}, 2), Error);
}

}  // namespace
}  // namespace minidl
