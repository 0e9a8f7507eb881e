// Embedding, layernorm, GELU, softmax and softmax + cross-entropy: float64 finite-difference gradient checks, the
// fused f32 ops against their unfused composition written here in double loops, and bad-input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "core/parallel.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layernorm.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

namespace {

// GELU (tanh) in double, and its derivative by central differences: independent of the kernel's closed form.
double gelu_ref(double u) { return 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u))); }
double gelu_grad_ref(double u) { return (gelu_ref(u + 1e-6) - gelu_ref(u - 1e-6)) / 2e-6; }

}  // namespace

// ---- embedding ----

TEST(Embedding, GradCheckF64) {
  Tensor w = grad_leaf({7, 5}, 1, DType::f64);
  for (DType idt : {DType::i32, DType::i64}) {
    Tensor ids = Tensor::from_vector(std::vector<double>{3, 0, 3, 6, 1, 3}, {2, 3}, idt);
    expect_gradients_match([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {w});
  }
}

TEST(Embedding, MatchesGatherAndScatterAdd) {
  const int64_t V = 11, C = 37, N = 150;  // N > one position block; ids repeat
  Tensor w = grad_leaf({V, C}, 2, DType::f32);
  std::vector<int64_t> id(N);
  for (int64_t n = 0; n < N; ++n) id[size_t(n)] = (n * 7 + n / 13) % V;
  Tensor ids = Tensor::from_vector(id, {N});
  Values R = random_values(N * C, 3);
  ForwardBackward fb = forward_backward([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {w}, R);
  Values wv = w.to_vector(), out(size_t(N * C)), dw(size_t(V * C), 0.0);
  Values r32 = Tensor::from_vector(R, {N * C}).to_vector();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      out[size_t(n * C + c)] = wv[size_t(id[size_t(n)] * C + c)];
      dw[size_t(id[size_t(n)] * C + c)] += r32[size_t(n * C + c)];
    }
  expect_close(fb.out, out, 0, "embedding forward");
  expect_close(fb.grad[0], dw, 1e-6, "embedding dweight");
}

TEST(Embedding, IdOutOfRangeNamesIdAndV) {
  Tensor w = Tensor::zeros({4, 3});
  expect_error([&] { embedding(w, Tensor::from_vector(std::vector<int64_t>{1, 9}, {2})); }, {"id 9", "V = 4"});
  expect_error([&] { embedding(w, Tensor::from_vector(std::vector<int32_t>{-1}, {1})); }, {"id -1", "V = 4"});
  expect_error([&] { embedding(w, Tensor::zeros({2})); }, {"i32 or i64", "got f32"});
}

// ---- layernorm ----

TEST(LayerNorm, GradCheckF64) {
  Tensor x = grad_leaf({2, 3, 5}, 4, DType::f64), w = grad_leaf({5}, 5, DType::f64), b = grad_leaf({5}, 6, DType::f64);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2]); }, {x, w, b});
}

// Against the formula in double, epsilon inside the square root: x of size 2 (variance ~1.3, where epsilon moves
// rstd by 4e-6, under the 1e-5 tolerance: a misplaced epsilon passes there) and of size 4e-3 (variance ~5e-6, below
// epsilon: 1 / (sqrt(var) + eps) would read rstd 70% too large).
namespace {
void expect_layernorm_matches_the_formula(double scale) {
  SCOPED_TRACE("x of size " + std::to_string(scale));
  const int64_t rows = 210, C = 37;  // rows span several dweight/dbias partial blocks
  const double eps = 1e-5;
  Tensor x = grad_leaf({3, 70, C}, 7, DType::f32, scale), w = grad_leaf({C}, 8, DType::f32),
         b = grad_leaf({C}, 9, DType::f32);
  Values R = random_values(rows * C, 10);
  ForwardBackward fb = forward_backward(
      [&](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2], eps); }, {x, w, b}, R);
  Values xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector(), r = Tensor::from_vector(R, {rows * C}).to_vector();
  Values y(xv.size()), dx(xv.size()), dw(size_t(C), 0.0), db(size_t(C), 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    const double* xr = &xv[size_t(n * C)];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += xr[c] / C;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean) / C;
    double rstd = 1 / std::sqrt(var + eps);
    Values xhat(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      xhat[size_t(c)] = (xr[c] - mean) * rstd;
      y[size_t(n * C + c)] = xhat[size_t(c)] * wv[size_t(c)] + bv[size_t(c)];
      dw[size_t(c)] += r[size_t(n * C + c)] * xhat[size_t(c)];
      db[size_t(c)] += r[size_t(n * C + c)];
    }
    // The Jacobian of xhat: d xhat_j / d x_i = rstd * (delta_ij - 1/C - xhat_i xhat_j / C).
    for (int64_t i = 0; i < C; ++i) {
      double s = 0;
      for (int64_t j = 0; j < C; ++j)
        s += r[size_t(n * C + j)] * wv[size_t(j)] * rstd * ((i == j) - 1.0 / C - xhat[size_t(i)] * xhat[size_t(j)] / C);
      dx[size_t(n * C + i)] = s;
    }
  }
  expect_close(fb.out, y, 1e-5, "layernorm y");
  expect_close(fb.grad[0], dx, 1e-5, "layernorm dx");
  expect_close(fb.grad[1], dw, 1e-5, "layernorm dweight");
  expect_close(fb.grad[2], db, 1e-5, "layernorm dbias");
}
}  // namespace

TEST(LayerNorm, MatchesMeanVarianceFormula) {
  expect_layernorm_matches_the_formula(2.0);
  expect_layernorm_matches_the_formula(4e-3);
}

TEST(LayerNorm, BackwardBitwiseSameForOneAndTwoThreads) {
  Tensor x = random_tensor({300, 19}, 11, DType::f32), w = random_tensor({19}, 12, DType::f32);
  Tensor b = random_tensor({19}, 13, DType::f32), dy = random_tensor({300, 19}, 14, DType::f32);
  ops::LayerNormForward f = ops::layernorm_forward(x, w, b, 1e-5);
  int saved = num_threads();
  set_num_threads(1);
  ops::LayerNormBackward one = ops::layernorm_backward(dy, x, w, f.mean, f.rstd);
  set_num_threads(2);
  ops::LayerNormBackward two = ops::layernorm_backward(dy, x, w, f.mean, f.rstd);
  set_num_threads(saved);
  EXPECT_EQ(one.dweight.to_vector(), two.dweight.to_vector());
  EXPECT_EQ(one.dbias.to_vector(), two.dbias.to_vector());
  EXPECT_EQ(one.dx.to_vector(), two.dx.to_vector());
}

// add_layernorm on the CPU sums each row and normalises it in one pass: the same bits as add, then layernorm, for
// f32 and f64 at 1 and 2 threads (tests/autograd/test_add_layernorm.cpp compares the graphs, at the default count).
TEST(LayerNorm, AddLayerNormIsAddThenLayerNormBitwise) {
  const int saved = num_threads();
  for (DType dt : {DType::f32, DType::f64})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << ", " << threads << " threads");
      Tensor a = random_tensor({301, 37}, 31, dt), b = random_tensor({301, 37}, 32, dt);
      Tensor w = random_tensor({37}, 33, dt), bias = random_tensor({37}, 34, dt);
      const ops::AddLayerNormForward fused = ops::add_layernorm_forward(a, b, w, bias, 1e-5);
      const Tensor sum = ops::add(a, b);
      const ops::LayerNormForward plain = ops::layernorm_forward(sum, w, bias, 1e-5);
      EXPECT_EQ(fused.sum.to_vector(), sum.to_vector());
      EXPECT_EQ(fused.y.to_vector(), plain.y.to_vector());
      EXPECT_EQ(fused.mean.to_vector(), plain.mean.to_vector());
      EXPECT_EQ(fused.rstd.to_vector(), plain.rstd.to_vector());
    }
  set_num_threads(saved);
}

// The backward's residual gradient is added in the layer norm's pass (ops/cpu/layernorm.cpp): the bits of the layer
// norm's dx and an add after it, on rows with a vector tail (37) and whole vectors (128).
TEST(LayerNorm, AddLayerNormBackwardIsLayerNormBackwardThenAddBitwise) {
  const int saved = num_threads();
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t C : {37, 128})
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << ", C " << C << ", " << threads << " threads");
        Tensor a = random_tensor({301, C}, 41, dt), b = random_tensor({301, C}, 42, dt);
        Tensor w = random_tensor({C}, 43, dt), bias = random_tensor({C}, 44, dt);
        Tensor dy = random_tensor({301, C}, 45, dt), dsum = random_tensor({301, C}, 46, dt);
        const ops::AddLayerNormForward f = ops::add_layernorm_forward(a, b, w, bias, 1e-5);
        const ops::LayerNormBackward fused = ops::add_layernorm_backward(dy, dsum, f.sum, w, f.mean, f.rstd);
        const ops::LayerNormBackward plain = ops::layernorm_backward(dy, f.sum, w, f.mean, f.rstd);
        EXPECT_EQ(fused.dx.to_vector(), ops::add(plain.dx, dsum).to_vector());
        EXPECT_EQ(fused.dweight.to_vector(), plain.dweight.to_vector());
        EXPECT_EQ(fused.dbias.to_vector(), plain.dbias.to_vector());
        const ops::LayerNormBackward alone = ops::add_layernorm_backward(dy, Tensor(), f.sum, w, f.mean, f.rstd);
        EXPECT_EQ(alone.dx.to_vector(), plain.dx.to_vector());
      }
  set_num_threads(saved);
}

// The differentiable wrapper accepts strided views: the gradient reaches the base tensor through the copy.
TEST(LayerNorm, NonContiguousInputGetsGradient) {
  Tensor x = grad_leaf({4, 3}, 27, DType::f64), w = Tensor::ones({4}, DType::f64), b = Tensor::zeros({4}, DType::f64);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return layernorm(in[0].transpose(0, 1), w, b); }, {x});
}

TEST(LayerNorm, BadWeightShapeNamesExpectedAndGot) {
  expect_error(
      [] {
        layernorm(Tensor::zeros({2, 5}), Tensor::ones({4}), Tensor::zeros({5}));
      },
      {"weight of shape (5,)", "got (4,)"});
  expect_error(
      [] {
        layernorm(Tensor::zeros({2, 5}), Tensor::ones({5}), Tensor::zeros({5}, DType::f64));
      },
      {"bias to have dtype f32", "got f64"});
  expect_error([] { layernorm(Tensor::zeros({2, 5}), Tensor::ones({5}), Tensor()); }, {"layernorm: bias is undefined"});
}

// ---- GELU ----

TEST(Gelu, GradCheckF64) {
  Tensor x = grad_leaf({3, 7}, 15, DType::f64, 2.0);
  expect_gradients_match([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {x});
}

TEST(BiasGelu, GradCheckF64) {
  Tensor x = grad_leaf({4, 6}, 16, DType::f64, 2.0), b = grad_leaf({6}, 17, DType::f64);
  expect_gradients_match([](const std::vector<Tensor>& in) { return bias_gelu(in[0], in[1]); }, {x, b});
}

TEST(BiasGelu, MatchesGeluOfSum) {
  const int64_t rows = 130, C = 37;
  Tensor x = grad_leaf({rows, C}, 18, DType::f32, 2.0), b = grad_leaf({C}, 19, DType::f32);
  Values R = random_values(rows * C, 20);
  ForwardBackward fb =
      forward_backward([](const std::vector<Tensor>& in) { return bias_gelu(in[0], in[1]); }, {x, b}, R);
  ForwardBackward plain = forward_backward([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {x}, R);
  Values xv = x.to_vector(), bv = b.to_vector(), r = Tensor::from_vector(R, {rows * C}).to_vector();
  Values y(xv.size()), dx(xv.size()), db(size_t(C), 0.0), y_plain(xv.size()), dx_plain(xv.size());
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t c = 0; c < C; ++c) {
      size_t i = size_t(n * C + c);
      double u = xv[i] + bv[size_t(c)];
      y[i] = gelu_ref(u);
      dx[i] = r[i] * gelu_grad_ref(u);
      db[size_t(c)] += dx[i];
      y_plain[i] = gelu_ref(xv[i]);
      dx_plain[i] = r[i] * gelu_grad_ref(xv[i]);
    }
  expect_close(fb.out, y, 1e-5, "bias_gelu y");
  expect_close(fb.grad[0], dx, 1e-5, "bias_gelu dx");
  expect_close(fb.grad[1], db, 1e-5, "bias_gelu dbias");
  expect_close(plain.out, y_plain, 1e-5, "gelu y");
  expect_close(plain.grad[0], dx_plain, 1e-5, "gelu dx");
}

// ---- softmax ----

TEST(Softmax, GradCheckF64) {
  Tensor x = grad_leaf({3, 7}, 21, DType::f64, 3.0);
  expect_gradients_match([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x});
}

TEST(Softmax, MatchesExpOverSumAndJacobian) {
  const int64_t rows = 5, V = 33;
  Tensor x = grad_leaf({rows, V}, 22, DType::f32, 4.0);
  Values R = random_values(rows * V, 23);
  ForwardBackward fb = forward_backward([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x}, R);
  Values xv = x.to_vector(), r = Tensor::from_vector(R, {rows * V}).to_vector(), p(xv.size()), dx(xv.size());
  for (int64_t n = 0; n < rows; ++n) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(xv[size_t(n * V + j)]);
    for (int64_t j = 0; j < V; ++j) p[size_t(n * V + j)] = std::exp(xv[size_t(n * V + j)]) / s;
    // The Jacobian of softmax: d p_j / d x_i = p_j (delta_ij - p_i).
    const double* pr = &p[size_t(n * V)];
    for (int64_t i = 0; i < V; ++i) {
      double g = 0;
      for (int64_t j = 0; j < V; ++j) g += r[size_t(n * V + j)] * pr[j] * ((i == j) - pr[i]);
      dx[size_t(n * V + i)] = g;
    }
  }
  expect_close(fb.out, p, 1e-5, "softmax y");
  expect_close(fb.grad[0], dx, 1e-5, "softmax dx");
}

// ---- softmax + cross-entropy ----

TEST(CrossEntropy, GradCheckF64) {
  Tensor logits = grad_leaf({5, 7}, 24, DType::f64, 2.0);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{3, -1, 0, 6, 3}, {5});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets); }, {logits});
}

static void expect_cross_entropy_matches_log_softmax_then_nll(int64_t V) {
  const int64_t N = 70, ignore = -100;
  Tensor logits = grad_leaf({N, V}, 25, DType::f32, 3.0);
  std::vector<int32_t> t(N);
  for (int64_t n = 0; n < N; ++n) t[size_t(n)] = n % 9 == 4 ? int32_t(ignore) : int32_t((n * 5) % V);
  Tensor targets = Tensor::from_vector(t, {N});
  const double g = 0.7;
  ForwardBackward fb = forward_backward(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets, ignore); }, {logits}, {g});
  Values x = logits.to_vector(), dx(x.size(), 0.0);
  double loss = 0;
  int count = 0;
  for (int64_t n = 0; n < N; ++n) count += t[size_t(n)] != ignore;
  for (int64_t n = 0; n < N; ++n) {
    if (t[size_t(n)] == ignore) continue;
    const double* xr = &x[size_t(n * V)];
    double m = *std::max_element(xr, xr + V), s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(xr[j] - m);
    double log_z = m + std::log(s);  // log_softmax_j = x_j - log_z
    loss -= (xr[t[size_t(n)]] - log_z) / count;
    // d loss / d x_j through log-softmax: the NLL gradient -1/count at the target, times (delta_tj - p_j).
    for (int64_t j = 0; j < V; ++j)
      dx[size_t(n * V + j)] = -g / count * ((j == t[size_t(n)]) - std::exp(xr[j] - log_z));
  }
  expect_close(fb.out, {loss}, 1e-6, "cross_entropy loss");
  expect_close(fb.grad[0], dx, 1e-5, "cross_entropy dlogits");
}

// V = 5000: the forward's one pass (simd::logsumexp_row) takes its exps against the max of a row's first vectors,
// which a long row's max lies far beyond.
TEST(CrossEntropy, MatchesLogSoftmaxThenNll) {
  for (const int64_t V : {33, 5000}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    expect_cross_entropy_matches_log_softmax_then_nll(V);
  }
}

// Logits of -inf (a masked vocabulary) get probability 0, a run of them longer than the first vectors whose max
// simd::logsumexp_row starts from (-inf: it sums the row again against its max).
TEST(CrossEntropy, NegativeInfinityLogitsAreMaskedOut) {
  const int64_t V = 2600;
  Values x = random_values(V, 26);
  for (int64_t j = 0; j < 2550; ++j) x[size_t(j)] = -INFINITY;
  Tensor logits = Tensor::from_vector(x, {1, V});
  logits.set_requires_grad(true);
  Tensor loss = cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{2580}, {1}));
  loss.backward();
  double m = *std::max_element(x.begin() + 2550, x.end()), z = 0;
  for (int64_t j = 2550; j < V; ++j) z += std::exp(x[size_t(j)] - m);
  EXPECT_NEAR(loss.item(), m + std::log(z) - x[2580], 1e-5);
  Values dx = logits.grad().to_vector();
  for (int64_t j = 0; j < 2550; ++j) ASSERT_EQ(dx[size_t(j)], 0.0) << "masked logit " << j;
  EXPECT_NEAR(dx[2580], std::exp(x[2580] - m) / z - 1, 1e-5);
}

TEST(CrossEntropy, TargetOutOfRangeNamesTargetAndV) {
  Tensor logits = Tensor::zeros({3, 5});
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{1, 7, 2}, {3}));
      },
      {"target 7", "row 1", "< 5"});
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}));
      },
      {"targets of shape (3,)", "got (2,)"});
}
