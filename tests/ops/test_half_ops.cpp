// 16-bit storage support of the ops mixed precision uses: each op on f16/bf16 inputs against the f32 op on the
// same (rounded) values, with dtype-aware tolerances: one rounding of the result is ~2^-9 relative for bf16 and
// ~2^-12 for f16, so bf16 must agree to 1e-2 and f16 to 2e-3 of the tensor's scale.
#include <gtest/gtest.h>

#include "nn_test_util.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/gelu.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

using namespace minidl;
using minidl::testing::expect_close;
using minidl::testing::random_tensor;

namespace {

class HalfOps : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  double rtol() const { return dt() == DType::bf16 ? 1e-2 : 2e-3; }
  // A random 16-bit tensor and its exact f32 copy (the reference reads the rounded values).
  std::pair<Tensor, Tensor> pair(const Shape& shape, uint64_t seed, double scale = 1.0) const {
    Tensor h = random_tensor(shape, seed, dt(), scale);
    return {h, ops::cast(h, DType::f32)};
  }
  // got must have the 16-bit dtype and match want (f32).
  void expect_matches(const Tensor& got, const Tensor& want, const std::string& what) const {
    EXPECT_EQ(got.dtype(), dt()) << what;
    expect_close(got.to_vector(), want.to_vector(), rtol(), what);
  }
};

}  // namespace

TEST_P(HalfOps, CastRoundTripsAndRoundsToNearest) {
  auto [h, f] = pair({1000}, 1);
  Tensor back = ops::cast(f, dt());
  EXPECT_EQ(back.to_vector(), h.to_vector());  // 16 -> 32 is exact, so 32 -> 16 gives the same bits back
  // Random values, then edge cases (f16 subnormals, ties to even, the overflow threshold, inf) repeated so the
  // vectorised path and its scalar tail both see them.
  std::vector<double> values = minidl::testing::random_tensor({1000}, 2, DType::f32).to_vector();
  for (int rep = 0; rep < 3; ++rep)
    for (double v : {1e-6, -3e-7, 5.960464477539063e-08, 2.9802322387695312e-08, 1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048,
                     65504.0, 65519.0, 65520.0, -1e5, double(INFINITY), 3e38})
      values.push_back(v);
  Tensor x = Tensor::from_vector(values, {int64_t(values.size())});
  Tensor r = ops::cast(x, dt());
  std::vector<double> xs = x.to_vector(), rs = r.to_vector();
  for (size_t i = 0; i < xs.size(); ++i) {
    float v = float(xs[i]);
    double want = dt() == DType::bf16 ? double(to_float(to_bf16(v))) : double(to_float(to_f16(v)));
    ASSERT_EQ(rs[i], want) << i;
  }
  EXPECT_EQ(ops::upcast(x).impl(), x.impl());  // f32 passes through
}

TEST_P(HalfOps, BinaryAndUnaryElementwise) {
  auto [a, a32] = pair({4, 33}, 3);
  auto [b, b32] = pair({33}, 4);
  expect_matches(ops::add(a, b), ops::add(a32, b32), "add (broadcast)");
  expect_matches(ops::mul(a, b), ops::mul(a32, b32), "mul");
  expect_matches(ops::mul(a, 0.37), ops::mul(a32, 0.37), "mul scalar");
  expect_matches(ops::sum_to_shape(a, {33}), ops::sum_to_shape(a32, {33}), "sum_to_shape");
  expect_matches(ops::sum(a, 0), ops::sum(a32, 0), "sum over rows");
  expect_matches(ops::mean(a, 1), ops::mean(a32, 1), "mean over columns");
}

TEST_P(HalfOps, GeluAndBiasGelu) {
  auto [x, x32] = pair({8, 40}, 5, 2.0);
  auto [b, b32] = pair({40}, 6);
  auto [dy, dy32] = pair({8, 40}, 7);
  expect_matches(ops::gelu_forward(x), ops::gelu_forward(x32), "gelu");
  expect_matches(ops::gelu_backward(dy, x), ops::gelu_backward(dy32, x32), "gelu backward");
  expect_matches(ops::bias_gelu_forward(x, b), ops::bias_gelu_forward(x32, b32), "bias_gelu");
  ops::BiasGeluBackward g = ops::bias_gelu_backward(dy, x, b), g32 = ops::bias_gelu_backward(dy32, x32, b32);
  expect_matches(g.dx, g32.dx, "bias_gelu dx");
  expect_matches(g.dbias, g32.dbias, "bias_gelu dbias");
}

TEST_P(HalfOps, DropoutUsesTheSameMask) {
  auto [x, x32] = pair({3, 101}, 8);
  Tensor y = ops::dropout(x, 0.3, 11, 2, 5), y32 = ops::dropout(x32, 0.3, 11, 2, 5);
  expect_matches(y, y32, "dropout");
  std::vector<double> a = y.to_vector(), b = y32.to_vector();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i] == 0.0, b[i] == 0.0) << "mask differs at " << i;
}

TEST_P(HalfOps, MatmulAndLinearAccumulateInF32) {
  auto [a, a32] = pair({2, 24, 40}, 9);
  auto [w, w32] = pair({40, 16}, 10);
  auto [bias, bias32] = pair({16}, 11);
  expect_matches(ops::matmul(a, w), ops::matmul(a32, w32), "batched x shared");
  expect_matches(ops::matmul(a, a, false, true), ops::matmul(a32, a32, false, true), "a a^T");
  expect_matches(ops::linear(a, w, bias), ops::linear(a32, w32, bias32), "linear");
  // f32 accumulation: 4096 products of 1 sum to 4096 exactly, which bf16 accumulation could not (its spacing at
  // 256 is already 2).
  Tensor ones = Tensor::ones({1, 4096}, dt()), col = Tensor::ones({4096, 1}, dt());
  EXPECT_EQ(ops::matmul(ones, col).item(), 4096.0);
}

TEST_P(HalfOps, AttentionForwardAndBackward) {
  const int H = 2;
  auto [qkv, qkv32] = pair({2, 70, 3 * 16}, 12);
  auto [dout, dout32] = pair({2, 70, 16}, 13);
  ops::AttentionForward f = ops::causal_attention_forward(qkv, H), f32 = ops::causal_attention_forward(qkv32, H);
  expect_matches(f.out, f32.out, "attention out");
  EXPECT_EQ(f.lse.dtype(), DType::f32);
  expect_close(f.lse.to_vector(), f32.lse.to_vector(), 1e-6, "lse");
  // Backward from the 16-bit saved output against the f32 backward from the f32 output.
  Tensor d = ops::causal_attention_backward(dout, qkv, f.out, f.lse, H);
  Tensor d32 = ops::causal_attention_backward(dout32, qkv32, f32.out, f32.lse, H);
  expect_matches(d, d32, "attention dqkv");
}

// Large enough that the f32 copies are made in several row blocks (ops::half_block_rows): every block boundary,
// the partial last block, and the accumulated reductions (dW, dbias) must give the one-block result.
TEST_P(HalfOps, RowBlockedPathsMatchTheF32Ops) {
  const int64_t rows = 3000, in = 200, out = 180;
  ASSERT_GT(rows, ops::half_block_rows(in));  // more than one block
  auto [x, x32] = pair({rows, in}, 21);
  auto [w, w32] = pair({in, out}, 22);
  auto [dy, dy32] = pair({rows, out}, 23);
  auto [b, b32] = pair({in}, 24);
  expect_matches(ops::linear(x, w, Tensor()), ops::linear(x32, w32, Tensor()), "linear");
  expect_matches(ops::matmul(x.view({3, 1000, in}), w), ops::matmul(x32.view({3, 1000, in}), w32), "batched rows");
  expect_matches(ops::matmul(dy, w, false, true), ops::matmul(dy32, w32, false, true), "dX = dY W^T");
  expect_matches(ops::matmul(x, dy, true, false), ops::matmul(x32, dy32, true, false), "dW = X^T dY");
  expect_matches(ops::bias_gelu_forward(x, b), ops::bias_gelu_forward(x32, b32), "bias_gelu");
  ops::BiasGeluBackward g = ops::bias_gelu_backward(x, x, b), g32 = ops::bias_gelu_backward(x32, x32, b32);
  expect_matches(g.dx, g32.dx, "bias_gelu dx");
  expect_matches(g.dbias, g32.dbias, "bias_gelu dbias");
  const int H = 4;
  auto [qkv, qkv32] = pair({5, 64, 3 * 1024}, 25, 0.3);  // 196608 elements a sequence: 2 sequences a block
  ASSERT_LT(ops::half_block_rows(64 * 3 * 1024), 5);
  auto [dout, dout32] = pair({5, 64, 1024}, 26);
  ops::AttentionForward f = ops::causal_attention_forward(qkv, H), f32 = ops::causal_attention_forward(qkv32, H);
  expect_matches(f.out, f32.out, "attention out");
  expect_close(f.lse.to_vector(), f32.lse.to_vector(), 1e-6, "lse");
  expect_matches(ops::causal_attention_backward(dout, qkv, f.out, f.lse, H),
                 ops::causal_attention_backward(dout32, qkv32, f32.out, f32.lse, H), "attention dqkv");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOps, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
