// conv2d and max_pool2d on the CPU (ops/conv.h): against direct loops written here in double (forward and all
// three gradients), float64 finite-difference checks through autograd, thread-count independence, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/functions.h"
#include "core/parallel.h"
#include "ops/conv.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

namespace {

struct Case {
  int64_t N, H, W, C, K, R, S, stride, pad, dil;
};

// Ragged sizes, channel counts that are multiples of nothing, both strides and paddings, a dilation, a
// rectangular kernel and the 1x1 fast path.
const Case kCases[] = {
    {2, 7, 6, 3, 5, 3, 3, 1, 1, 1}, {3, 8, 9, 2, 7, 3, 3, 2, 0, 1}, {1, 9, 7, 5, 3, 3, 2, 2, 1, 1},
    {2, 6, 6, 4, 6, 1, 1, 1, 0, 1}, {2, 9, 8, 3, 2, 3, 3, 1, 2, 2}, {9, 5, 5, 1, 4, 5, 5, 1, 0, 1},
};

int64_t out_size(int64_t in, int64_t k, const Case& c) { return (in + 2 * c.pad - c.dil * (k - 1) - 1) / c.stride + 1; }

struct Direct {
  Values y, dx, dw, db;
};

// The definition, one multiply-add at a time: y[n,p,q,k] = b[k] + sum_{r,s,c} x[n, p*st-pad+r*dil, q*st-pad+s*dil, c]
// * w[k,r,s,c], and the gradients as the same sum read the other way.
Direct direct_conv(const Case& c, const Values& x, const Values& w, const Values& b, const Values& dy) {
  int64_t P = out_size(c.H, c.R, c), Q = out_size(c.W, c.S, c);
  Direct d{Values(size_t(c.N * P * Q * c.K)), Values(x.size()), Values(w.size()), Values(size_t(c.K))};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t k = 0; k < c.K; ++k) {
          size_t o = size_t(((n * P + p) * Q + q) * c.K + k);
          double acc = b[size_t(k)];
          d.db[size_t(k)] += dy[o];
          for (int64_t r = 0; r < c.R; ++r)
            for (int64_t s = 0; s < c.S; ++s) {
              int64_t h = p * c.stride - c.pad + r * c.dil, ww = q * c.stride - c.pad + s * c.dil;
              if (h < 0 || h >= c.H || ww < 0 || ww >= c.W) continue;
              for (int64_t ch = 0; ch < c.C; ++ch) {
                size_t xi = size_t(((n * c.H + h) * c.W + ww) * c.C + ch);
                size_t wi = size_t(((k * c.R + r) * c.S + s) * c.C + ch);
                acc += x[xi] * w[wi];
                d.dx[xi] += dy[o] * w[wi];
                d.dw[wi] += dy[o] * x[xi];
              }
            }
          d.y[o] = acc;
        }
  return d;
}

}  // namespace

TEST(Conv2d, MatchesDirectConvolution) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(::testing::Message() << dtype << " x (" << c.N << "," << c.H << "," << c.W << "," << c.C
                                        << ") K=" << c.K << " " << c.R << "x" << c.S << " stride " << c.stride
                                        << " pad " << c.pad << " dil " << c.dil);
      Tensor x = random_tensor({c.N, c.H, c.W, c.C}, 1, dtype), w = random_tensor({c.K, c.R, c.S, c.C}, 2, dtype);
      Tensor b = random_tensor({c.K}, 3, dtype);
      ops::Conv2dOptions o{c.stride, c.pad, c.dil};
      Tensor y = ops::conv2d_forward(x, w, b, o);
      Tensor dy = random_tensor(y.shape(), 4, dtype);
      ops::Conv2dBackward g = ops::conv2d_backward(dy, x, w, o, true);
      Direct d = direct_conv(c, x.to_vector(), w.to_vector(), b.to_vector(), dy.to_vector());
      double rtol = dtype == DType::f64 ? 1e-12 : 2e-5;
      expect_close(y.to_vector(), d.y, rtol, "y");
      expect_close(g.dx.to_vector(), d.dx, rtol, "dx");
      expect_close(g.dweight.to_vector(), d.dw, rtol, "dweight");
      expect_close(g.dbias.to_vector(), d.db, rtol, "dbias");
      EXPECT_FALSE(ops::conv2d_backward(dy, x, w, o, false).dx.defined());
    }
  }
}

TEST(Conv2d, GradCheckF64) {
  for (const Case& c : {kCases[0], kCases[1], kCases[2], kCases[3]}) {
    Tensor x = randn64({c.N, c.H, c.W, c.C}, 5).set_requires_grad(true);
    Tensor w = randn64({c.K, c.R, c.S, c.C}, 6).set_requires_grad(true);
    Tensor b = randn64({c.K}, 7).set_requires_grad(true);
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.stride, c.pad, c.dil); }, {x, w, b});
    // Without bias, and a square activation after it so the gradient flowing in is not the constant R.
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return square(conv2d(in[0], in[1], Tensor(), c.stride, c.pad, c.dil)); },
        {x, w});
  }
}

TEST(Conv2d, BackwardBitwiseSameForOneAndTwoThreads) {
  Tensor x = random_tensor({21, 9, 9, 3}, 11, DType::f32), w = random_tensor({5, 3, 3, 3}, 12, DType::f32);
  ops::Conv2dOptions o{1, 1, 1};
  Tensor dy = random_tensor({21, 9, 9, 5}, 13, DType::f32);
  int saved = num_threads();
  set_num_threads(1);
  ops::Conv2dBackward one = ops::conv2d_backward(dy, x, w, o, true);
  set_num_threads(2);
  ops::Conv2dBackward two = ops::conv2d_backward(dy, x, w, o, true);
  set_num_threads(saved);
  EXPECT_EQ(one.dweight.to_vector(), two.dweight.to_vector());
  EXPECT_EQ(one.dbias.to_vector(), two.dbias.to_vector());
  EXPECT_EQ(one.dx.to_vector(), two.dx.to_vector());
}

TEST(Conv2d, BadInputNamesWhatWasExpected) {
  Tensor x = Tensor::zeros({2, 5, 5, 3}), w = Tensor::zeros({4, 3, 3, 3});
  expect_error(
      [&] {
        ops::conv2d_forward(Tensor::zeros({5, 5, 3}), w, Tensor(), {});
      },
      {"conv2d", "(N, H, W, C)", "(5, 5, 3)"});
  expect_error(
      [&] {
        ops::conv2d_forward(x, Tensor::zeros({4, 3, 3, 2}), Tensor(), {});
      },
      {"conv2d", "2 input channels", "has 3"});
  expect_error([&] { ops::conv2d_forward(x, w, Tensor::zeros({5}), {}); }, {"conv2d", "bias", "(4,)", "(5,)"});
  expect_error(
      [&] {
        ops::conv2d_forward(x, Tensor::zeros({4, 7, 7, 3}), Tensor(), {});
      },
      {"conv2d", "7x7 kernel", "does not fit", "5x5"});
  expect_error([&] { ops::conv2d_forward(x, w, Tensor(), {.stride = 0}); }, {"conv2d", "stride >= 1", "0"});
  expect_error([&] { ops::conv2d_forward(x, w.to(DType::f64), Tensor(), {}); }, {"conv2d", "weight", "f32", "f64"});
  expect_error(
      [&] {
        ops::conv2d_backward(Tensor::zeros({2, 3, 3, 5}), x, w, {}, true);
      },
      {"conv2d_backward", "dy", "(2, 3, 3, 4)"});
}

// ---- max_pool2d ----

namespace {

// Direct max pooling, gradient to the first maximum of each window in row-major order.
Direct direct_pool(const Shape& s, int64_t k, int64_t st, const Values& x, const Values& dy) {
  int64_t N = s[0], H = s[1], W = s[2], C = s[3], P = (H - k) / st + 1, Q = (W - k) / st + 1;
  Direct d{Values(size_t(N * P * Q * C)), Values(x.size()), {}, {}};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t c = 0; c < C; ++c) {
          double best = -std::numeric_limits<double>::infinity();
          size_t arg = 0;
          for (int64_t r = 0; r < k; ++r)
            for (int64_t t = 0; t < k; ++t) {
              size_t i = size_t(((n * H + p * st + r) * W + q * st + t) * C + c);
              if (x[i] > best) best = x[i], arg = i;
            }
          size_t o = size_t(((n * P + p) * Q + q) * C + c);
          d.y[o] = best;
          d.dx[arg] += dy[o];
        }
  return d;
}

}  // namespace

TEST(MaxPool2d, MatchesDirectPooling) {
  struct PoolCase {
    Shape shape;
    int64_t kernel, stride;
  };
  for (DType dtype : {DType::f64, DType::f32})
    for (const PoolCase& c : {PoolCase{{2, 8, 8, 3}, 2, 2}, PoolCase{{3, 7, 9, 5}, 3, 2}, PoolCase{{1, 5, 6, 2}, 2, 1},
                              PoolCase{{2, 7, 7, 4}, 2, 3}}) {
      SCOPED_TRACE(::testing::Message() << dtype << " " << c.shape << " kernel " << c.kernel << " stride " << c.stride);
      Tensor x = random_tensor(c.shape, 21, dtype);
      ops::Pool2dOptions o{c.kernel, c.stride};
      Tensor y = ops::max_pool2d_forward(x, o);
      Tensor dy = random_tensor(y.shape(), 22, dtype);
      Direct d = direct_pool(c.shape, c.kernel, c.stride, x.to_vector(), dy.to_vector());
      EXPECT_EQ(y.to_vector(), d.y);
      expect_close(ops::max_pool2d_backward(dy, x, y, o).to_vector(), d.dx, 1e-6, "dx");
    }
}

TEST(MaxPool2d, TiesSendTheGradientToTheFirstMaximum) {
  Tensor x = Tensor::ones({1, 2, 2, 1});
  Tensor y = ops::max_pool2d_forward(x, {2, 2});
  Tensor dx = ops::max_pool2d_backward(Tensor::full({1, 1, 1, 1}, 3.0), x, y, {2, 2});
  EXPECT_EQ(dx.to_vector(), (Values{3, 0, 0, 0}));
}

TEST(MaxPool2d, GradCheckF64) {
  Tensor x = randn64({2, 7, 6, 3}, 31).set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 2); }, {x});
}

TEST(MaxPool2d, BadInputNamesWhatWasExpected) {
  expect_error([] { ops::max_pool2d_forward(Tensor::zeros({2, 3, 3}), {}); }, {"max_pool2d", "(N, H, W, C)"});
  expect_error(
      [] {
        ops::max_pool2d_forward(Tensor::zeros({1, 3, 3, 2}), {4, 1});
      },
      {"max_pool2d", "4x4 window", "3x3"});
  expect_error([] { ops::max_pool2d_forward(Tensor::zeros({1, 3, 3, 2}), {2, 0}); }, {"max_pool2d", "stride >= 1"});
}
