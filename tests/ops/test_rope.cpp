// RoPE (ops/rope.h): the float64 finite-difference gradient check; the f32 op against the rotate_half formula
// written here (angles in double from theta, a half width of 5 that no vector divides), forward and backward; a
// slice of a longer sequence at its position offset equal to that sequence's rows, bit for bit; and the scaled
// inverse frequencies against transformers' published formulas (linear, and llama3's three bands).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "ops/cast.h"
#include "ops/rope.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

namespace {

// transformers' _compute_llama3_parameters, on theta^(-2i / D), in double.
Values llama3_inv_freq(int64_t D, double theta, double factor, double low, double high, double L) {
  Values out;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = std::pow(theta, -double(2 * i) / double(D)), wavelen = 2 * M_PI / f;
    const double scaled = wavelen > L / low ? f / factor : f;
    const double smooth = (L / wavelen - low) / (high - low);
    const bool medium = !(wavelen < L / high) && !(wavelen > L / low);
    out.push_back(medium ? (1 - smooth) * scaled / factor + smooth * scaled : scaled);
  }
  return out;
}

}  // namespace

TEST(Rope, GradCheckF64) {
  const ops::RopeTables t = ops::rope_tables(8, 6, 100.0, {});
  const Tensor c = ops::cast(t.cos, DType::f64), s = ops::cast(t.sin, DType::f64);
  Tensor x = grad_leaf({2, 3, 2, 6}, 1, DType::f64);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return rope(in[0], c, s, 2); }, {x});
}

// y[i] = x[i] cos(p f_i) - x[i + D/2] sin(p f_i), y[i + D/2] = x[i + D/2] cos + x[i] sin, f_i = theta^(-2i/D),
// p = offset + t; backward: the transpose, dx[i] = dy[i] cos + dy[i + D/2] sin, dx[i + D/2] = dy[i + D/2] cos -
// dy[i] sin. An interleaved layout (pairs 2i, 2i + 1) is another rotation and fails both.
TEST(Rope, MatchesTheRotateHalfFormula) {
  const int64_t B = 2, T = 5, H = 3, D = 10, half = D / 2, offset = 3;
  const double theta = 10000.0;
  const ops::RopeTables t = ops::rope_tables(offset + T, D, theta, {});
  Tensor x = grad_leaf({B, T, H, D}, 2, DType::f32);
  Values R = random_values(B * T * H * D, 3);
  ForwardBackward fb =
      forward_backward([&](const std::vector<Tensor>& in) { return rope(in[0], t.cos, t.sin, offset); }, {x}, R);
  Values xv = x.to_vector(), r = Tensor::from_vector(R, {B * T * H * D}).to_vector();
  Values y(xv.size()), dx(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t tt = 0; tt < T; ++tt)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double a = double(offset + tt) * std::pow(theta, -double(2 * i) / double(D));
          const size_t lo = size_t(((b * T + tt) * H + h) * D + i), hi = lo + size_t(half);
          y[lo] = xv[lo] * std::cos(a) - xv[hi] * std::sin(a);
          y[hi] = xv[hi] * std::cos(a) + xv[lo] * std::sin(a);
          dx[lo] = r[lo] * std::cos(a) + r[hi] * std::sin(a);
          dx[hi] = r[hi] * std::cos(a) - r[lo] * std::sin(a);
        }
  expect_close(fb.out, y, 1e-6, "rope y");
  expect_close(fb.grad[0], dx, 1e-6, "rope dx");
}

// A KV cache's new rows, or a context-parallel chunk: rows [s, s + n) of a sequence, rotated on their own at
// position offset s, are the same bits as those rows of the whole sequence rotated from 0; one decoded token too.
TEST(Rope, OffsetSliceEqualsTheLongerSequencesRows) {
  const int64_t B = 2, T = 12, H = 2, D = 64;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ops::RopeTables t = ops::rope_tables(T, D, 5e5, {});
    const Tensor x = random_tensor({B, T, H, D}, 4, dt);
    const Tensor whole = ops::rope_forward(x, t.cos, t.sin, 0);
    for (auto [start, n] : {std::pair<int64_t, int64_t>{5, 4}, {11, 1}, {0, 3}}) {
      const Tensor part = ops::rope_forward(x.narrow(1, start, n).contiguous(), t.cos, t.sin, start);
      EXPECT_EQ(part.to_vector(), whole.narrow(1, start, n).contiguous().to_vector()) << "rows from " << start;
      const Tensor back = ops::rope_backward(x.narrow(1, start, n).contiguous(), t.cos, t.sin, start);
      EXPECT_EQ(back.to_vector(), ops::rope_backward(x, t.cos, t.sin, 0).narrow(1, start, n).contiguous().to_vector());
    }
  }
}

TEST(Rope, Llama3ScalingMatchesThePublishedFormula) {
  // Llama 3.1's rope_scaling, and a short original context so a head_dim of 16 reaches all three bands.
  struct Case {
    int64_t D;
    double theta, factor, low, high;
    int64_t L;
  };
  for (const Case& c : {Case{128, 5e5, 8.0, 1.0, 4.0, 8192}, Case{16, 1e4, 4.0, 1.0, 4.0, 32}}) {
    SCOPED_TRACE("head_dim " + std::to_string(c.D));
    ops::RopeScaling scaling{ops::RopeType::kLlama3, c.factor, c.low, c.high, c.L};
    const Values want = llama3_inv_freq(c.D, c.theta, c.factor, c.low, c.high, double(c.L));
    const Values got = ops::rope_inv_freq(c.D, c.theta, scaling).to_vector();
    int unchanged = 0, divided = 0, smoothed = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], want[i] * 1e-7) << "inv_freq " << i;
      const double f = std::pow(c.theta, -double(2 * i) / double(c.D));
      unchanged += want[i] == f;
      divided += std::abs(want[i] - f / c.factor) < 1e-12 * f;
      smoothed += want[i] != f && std::abs(want[i] - f / c.factor) >= 1e-12 * f;
    }
    EXPECT_GT(unchanged, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(smoothed, 0);
    // Exact at position 0, apart at long positions: ignoring the scaling cannot pass.
    const ops::RopeTables scaled = ops::rope_tables(4 * c.L, c.D, c.theta, scaling);
    const ops::RopeTables plain = ops::rope_tables(4 * c.L, c.D, c.theta, {});
    EXPECT_EQ(scaled.cos.narrow(0, 0, 1).to_vector(), plain.cos.narrow(0, 0, 1).to_vector());
    EXPECT_NE(scaled.cos.narrow(0, 4 * c.L - 1, 1).to_vector(), plain.cos.narrow(0, 4 * c.L - 1, 1).to_vector());
  }
  // linear: every frequency divided by the factor.
  const Values lin = ops::rope_inv_freq(8, 1e4, {ops::RopeType::kLinear, 2.0}).to_vector();
  for (size_t i = 0; i < lin.size(); ++i) EXPECT_NEAR(lin[i], std::pow(1e4, -double(2 * i) / 8) / 2, lin[i] * 1e-7);
}

TEST(Rope, BadInputNamesWhatWasExpected) {
  const ops::RopeTables t = ops::rope_tables(4, 6, 1e4, {});
  expect_error(
      [&] {
        ops::rope_forward(Tensor::zeros({1, 3, 2, 6}), t.cos, t.sin, 2);
      },
      {"rope", "position_offset + T = 5"});
  expect_error([&] { ops::rope_forward(Tensor::zeros({1, 3, 2, 5}), t.cos, t.sin, 0); }, {"rope", "D even"});
  expect_error(
      [&] {
        ops::rope_inv_freq(8, 1e4, {ops::RopeType::kLlama3, 8.0, 1.0, 4.0, 0});
      },
      {"original_max_position_embeddings"});
}
