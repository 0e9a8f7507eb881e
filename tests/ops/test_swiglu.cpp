// SwiGLU (ops/swiglu.h): the float64 finite-difference gradient check, the f32 op against silu(g) * u and its
// derivatives written here in double (a length no vector divides, gates of both signs out to |g| ~ 30), and bf16
// inputs rounded once from the f32 op.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "ops/cast.h"
#include "ops/swiglu.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

namespace {}  // namespace

TEST(SwiGLU, GradCheckF64) {
  Tensor g = grad_leaf({3, 7}, 1, DType::f64, 2.0), u = grad_leaf({3, 7}, 2, DType::f64);
  expect_gradients_match([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {g, u});
}

TEST(SwiGLU, MatchesSiluTimesUp) {
  const Shape shape{7, 143};  // 1001 elements: whole vectors, then a tail, on every ISA
  Tensor g = grad_leaf(shape, 3, DType::f32, 8.0), u = grad_leaf(shape, 4, DType::f32);
  Values R = random_values(shape.numel(), 5);
  ForwardBackward fb = forward_backward([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {g, u}, R);
  Values gv = g.to_vector(), uv = u.to_vector(), r = Tensor::from_vector(R, shape).to_vector();
  Values y(gv.size()), dg(gv.size()), du(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) {
    const double s = 1 / (1 + std::exp(-gv[i]));
    y[i] = gv[i] * s * uv[i];
    dg[i] = r[i] * uv[i] * (s + gv[i] * s * (1 - s));
    du[i] = r[i] * gv[i] * s;
  }
  expect_close(fb.out, y, 1e-6, "swiglu y");
  expect_close(fb.grad[0], dg, 1e-6, "swiglu dgate");
  expect_close(fb.grad[1], du, 1e-6, "swiglu dup");
}

TEST(SwiGLU, Bf16IsTheF32OpRoundedOnce) {
  const Shape shape{5, 37};
  Tensor g = random_tensor(shape, 6, DType::bf16, 4.0), u = random_tensor(shape, 7, DType::bf16),
         dy = random_tensor(shape, 8, DType::bf16);
  const Tensor y = ops::swiglu_forward(g, u);
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_vector(), ops::cast(ops::swiglu_forward(ops::upcast(g), ops::upcast(u)), DType::bf16).to_vector());
  const ops::SwiGLUBackward d = ops::swiglu_backward(dy, g, u);
  const ops::SwiGLUBackward d32 = ops::swiglu_backward(ops::upcast(dy), ops::upcast(g), ops::upcast(u));
  EXPECT_EQ(d.dgate.to_vector(), ops::cast(d32.dgate, DType::bf16).to_vector());
  EXPECT_EQ(d.dup.to_vector(), ops::cast(d32.dup, DType::bf16).to_vector());
}

TEST(SwiGLU, BadInputNamesWhatWasExpected) {
  expect_error([] { ops::swiglu_forward(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})); }, {"swiglu", "up", "(2, 3)"});
}
