// matmul and linear against a naive triple loop in double: transposes, batches, strided views, threaded splits.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <sstream>

#include "core/parallel.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::expect_error_mentions;
using testing::uniform;

// op(t)[batch][r][c] for t of shape (..., R, C) given as row-major values. The shape is read once, not per
// element: the naive product runs tens of millions of these in the sanitizer build at -O0.
struct OpView {
  const std::vector<double>& v;
  int64_t R, C, batches;
  bool trans;
  OpView(const std::vector<double>& values, const Shape& s, bool t)
      : v(values), R(s.back(-2)), C(s.back(-1)), batches(s.numel() / std::max<int64_t>(R * C, 1)), trans(t) {}
  double at(int64_t batch, int64_t r, int64_t c) const {
    const int64_t b = batches == 1 ? 0 : batch;  // a 2-D operand is shared
    return trans ? v[size_t(b * R * C + c * C + r)] : v[size_t(b * R * C + r * C + c)];
  }
};

// The naive product, with the output shape the op must produce.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, Shape& out_shape) {
  std::vector<double> av = a.to_vector(), bv = b.to_vector();
  int64_t M = ta ? a.size(-1) : a.size(-2), K = ta ? a.size(-2) : a.size(-1), N = tb ? b.size(-2) : b.size(-1);
  const Tensor& batched = a.dim() >= b.dim() ? a : b;
  out_shape = Shape{};
  for (int i = 0; i < batched.dim() - 2; ++i) out_shape.push_back(batched.size(i));
  out_shape.push_back(M);
  out_shape.push_back(N);
  int64_t batches = out_shape.numel() / std::max<int64_t>(M * N, 1);
  const OpView A(av, a.shape(), ta), B(bv, b.shape(), tb);
  std::vector<double> out(size_t(out_shape.numel()));
  for (int64_t p = 0; p < batches; ++p)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += A.at(p, m, k) * B.at(p, k, n);
        out[size_t((p * M + m) * N + n)] = acc;
      }
  return out;
}

void expect_matmul_matches(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  SCOPED_TRACE(::testing::Message() << a.shape() << (ta ? "^T" : "") << " x " << b.shape() << (tb ? "^T" : "") << " "
                                    << a.dtype() << " threads " << num_threads());
  Shape want_shape;
  std::vector<double> want = naive_matmul(a, b, ta, tb, want_shape);
  Tensor c = ops::matmul(a, b, ta, tb);
  ASSERT_EQ(c.shape(), want_shape);
  std::vector<double> got = c.to_vector();
  double tol = a.dtype() == DType::f32 ? 1e-4 : 1e-12;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << i;
}

// (rows, cols) as op() expects it: stored (cols, rows) when trans.
Shape stored(int64_t rows, int64_t cols, bool trans) { return trans ? Shape{cols, rows} : Shape{rows, cols}; }

// Runs body once with OpenBLAS and once with minidl's own kernel (ops::set_cpu_gemm), then restores the default.
template <class Body>
void for_each_cpu_gemm(const Body& body) {
  for (ops::CpuGemm gemm : {ops::CpuGemm::kOpenBlas, ops::CpuGemm::kMinidl}) {
    SCOPED_TRACE(gemm == ops::CpuGemm::kMinidl ? "gemm minidl" : "gemm openblas");
    ops::set_cpu_gemm(gemm);
    body();
  }
  ops::set_cpu_gemm(ops::CpuGemm::kAuto);
}

TEST(Matmul, AllTransposeCombinations2D) {
  for_each_cpu_gemm([] {
    for (DType dt : {DType::f32, DType::f64})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          expect_matmul_matches(uniform(stored(37, 19, ta), 1, dt), uniform(stored(19, 23, tb), 2, dt), ta, tb);
  });
}

TEST(Matmul, BatchedAndShared) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape sa = stored(5, 4, ta), sb = stored(4, 6, tb);
      Tensor a3 = uniform({3, sa[0], sa[1]}, 3, DType::f64), b3 = uniform({3, sb[0], sb[1]}, 4, DType::f64);
      expect_matmul_matches(a3, b3, ta, tb);                          // equal batches
      expect_matmul_matches(a3, uniform(sb, 5, DType::f64), ta, tb);  // b shared (folded into M if !ta)
      expect_matmul_matches(uniform(sa, 6, DType::f64), b3, ta, tb);  // a shared
      expect_matmul_matches(uniform({2, 3, sa[0], sa[1]}, 7, DType::f64), uniform({2, 3, sb[0], sb[1]}, 8, DType::f64),
                            ta, tb);
    }
}

TEST(Matmul, StridedViewsWithoutAndWithCopies) {
  Tensor a = uniform({6, 5}, 9, DType::f64), b = uniform({5, 7}, 10, DType::f64);
  // A transposed view is passed to BLAS with the flag flipped.
  expect_matmul_matches(a.detach().transpose(0, 1), b, true, false);
  expect_matmul_matches(a, b.detach().transpose(0, 1), false, true);
  // A narrowed block has a leading dimension larger than its width.
  expect_matmul_matches(uniform({6, 9}, 11, DType::f64).detach().narrow(1, 2, 5), b, false, false);
  // Batches that cannot be stepped with one stride are copied.
  Tensor q = uniform({4, 3, 2, 5}, 12, DType::f64).detach().transpose(0, 1);  // (3, 4, 2, 5)
  expect_matmul_matches(q, uniform({3, 4, 5, 2}, 13, DType::f64), false, false);
  // A batched transposed view (like k^T in attention).
  Tensor k = uniform({3, 5, 4}, 14, DType::f64).detach().transpose(1, 2);  // (3, 4, 5)
  expect_matmul_matches(uniform({3, 6, 4}, 15, DType::f64), k, false, false);
}

TEST(Matmul, ThreadedSplitsMatchOneThread) {
  for_each_cpu_gemm([] {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          // Ragged M: the row blocks do not divide evenly.
          expect_matmul_matches(uniform(stored(1003, 64, ta), 16, DType::f32),
                                uniform(stored(64, 48, tb), 17, DType::f32), ta, tb);
          // Wide output: split by columns.
          expect_matmul_matches(uniform(stored(40, 64, ta), 18, DType::f32),
                                uniform(stored(64, 997, tb), 19, DType::f32), ta, tb);
        }
      // Weight gradient shapes: X^T dY, the reduction (1003, ragged) longer than the output: OpenBLAS's partial
      // products.
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          expect_matmul_matches(uniform(stored(48, 1003, ta), 20, DType::f32),
                                uniform(stored(1003, 96, tb), 21, DType::f32), ta, tb);
      // The same with a bias accumulated by the product (beta = 1): only one partial may add it.
      Tensor x = uniform({40, 1000}, 26, DType::f32), w = uniform({1000, 30}, 27, DType::f32);
      Tensor bias = uniform({30}, 28, DType::f32);
      Shape shape;
      std::vector<double> xw = naive_matmul(x, w, false, false, shape), y = ops::linear(x, w, bias).to_vector(),
                          bv = bias.to_vector();
      for (size_t i = 0; i < y.size(); ++i) {
        const double want = xw[i] + bv[i % 30];
        ASSERT_NEAR(y[i], want, 1e-4 * std::max(1.0, std::abs(want))) << i;
      }
      // A batch folded into M, and a batch of 5 over 2 threads.
      expect_matmul_matches(uniform({4, 301, 32}, 22, DType::f32), uniform({32, 40}, 23, DType::f32), false, false);
      expect_matmul_matches(uniform({5, 64, 32}, 24, DType::f32), uniform({5, 40, 32}, 25, DType::f32), false, true);
    }
  });
}

// minidl's own kernel sums every element in one order whatever the split, so 2 and 3 threads give 1 thread's bits:
// rows in pieces that threads claim (over several chunks of k and of columns), column blocks, the weight gradient's
// long reduction (in two halves whatever the thread count), and linear's bias.
// A linear layer's weight and bias gradients in one call (the bias's column sums in the weight gradient's parallel
// region where it splits the reduction in halves): dw bit for bit the product matmul and matmul_add_ give, dbias
// ops::sum(dy, 0)'s, on 1, 2 and 3 threads, with minidl's kernel and OpenBLAS; shapes that take the halves (rows
// more than in and out), a reduction shorter than the output, and one too small to split.
TEST(Matmul, LinearWeightBiasGradIsTheProductAndTheColumnSums) {
  for (ops::CpuGemm gemm : {ops::CpuGemm::kMinidl, ops::CpuGemm::kOpenBlas})
    for (int threads : {1, 2, 3}) {
      ops::set_cpu_gemm(gemm);
      set_num_threads(threads);
      for (const auto& [rows, in, out] :
           {std::array<int64_t, 3>{768, 128, 384}, {1003, 97, 45}, {40, 100, 300}, {12, 8, 5}}) {
        SCOPED_TRACE(::testing::Message() << (gemm == ops::CpuGemm::kMinidl ? "minidl" : "openblas") << ", " << threads
                                          << " threads, rows " << rows << ", in " << in << ", out " << out);
        const Tensor x = uniform({rows, in}, 31, DType::f32), dy = uniform({rows, out}, 32, DType::f32);
        const Tensor start = uniform({in, out}, 33, DType::f32);
        Tensor dw = Tensor::empty({in, out}), db = Tensor::full({out}, 7.0);  // db is set, not added to
        ops::linear_weight_bias_grad_into(dw, db, x, dy, /*accumulate=*/false);
        EXPECT_EQ(dw.to_vector(), ops::matmul(x, dy, true, false).to_vector());
        EXPECT_EQ(db.to_vector(), ops::sum(dy, 0).to_vector());
        Tensor acc = start.clone(), expected = start.clone();
        ops::linear_weight_bias_grad_into(acc, db, x, dy, /*accumulate=*/true);
        ops::matmul_add_(expected, x, dy, true, false);
        EXPECT_EQ(acc.to_vector(), expected.to_vector());
        EXPECT_EQ(db.to_vector(), ops::sum(dy, 0).to_vector());
      }
    }
  set_num_threads(default_num_threads());
  ops::set_cpu_gemm(ops::CpuGemm::kAuto);
  Tensor dw = Tensor::empty({3, 4}), db = Tensor::empty({4});
  expect_error_mentions(
      [&] {
        ops::linear_weight_bias_grad_into(dw, db, Tensor::zeros({5, 3}), Tensor::zeros({6, 4}), false);
      },
      {"same rows", "(5, 3)", "(6, 4)"});
  expect_error_mentions(
      [&] {
        ops::linear_weight_bias_grad_into(dw, db, Tensor::zeros({5, 4}), Tensor::zeros({5, 4}), false);
      },
      {"dw of shape (4, 4)", "got (3, 4)"});
}

TEST(Matmul, OwnKernelGivesTheSameBitsOnOneTwoAndThreeThreads) {
  ops::set_cpu_gemm(ops::CpuGemm::kMinidl);
  const auto run = [](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<double>> out;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto product = [&](int64_t M, int64_t K, int64_t N, uint64_t seed) {
          const Tensor a = uniform(stored(M, K, ta), seed, DType::f32);
          const Tensor b = uniform(stored(K, N, tb), seed + 1, DType::f32);
          return ops::matmul(a, b, ta, tb).to_vector();
        };
        out.push_back(product(1003, 64, 48, 16));                    // row blocks
        out.push_back(product(40, 64, 997, 18));                     // column blocks
        out.push_back(product(48, 1003, 96, 20));                    // the weight gradient's shape
        if (!ta && !tb) out.push_back(product(700, 1100, 300, 22));  // rows in pieces over chunks of k and columns
      }
    out.push_back(ops::linear(uniform({1003, 100}, 26, DType::f32), uniform({100, 300}, 27, DType::f32),
                              uniform({300}, 28, DType::f32))
                      .to_vector());
    return out;
  };
  const auto one = run(1), two = run(2), three = run(3);
  set_num_threads(default_num_threads());
  ops::set_cpu_gemm(ops::CpuGemm::kAuto);
  ASSERT_EQ(one.size(), two.size());
  ASSERT_EQ(one.size(), three.size());
  for (size_t p = 0; p < one.size(); ++p) {
    EXPECT_EQ(one[p], two[p]) << "product " << p;
    EXPECT_EQ(one[p], three[p]) << "product " << p << ", 3 threads";
  }
}

// ops::count_blas: every BLAS call adds its 2 M N K once, however a product is split over threads (row blocks,
// column blocks, partial products over the reduction, a batch), and nothing is counted while counting is off.
TEST(Matmul, CountedBlasFlopsAreTheProductsOwn) {
  struct Product {
    Shape a, b;
    bool ta, tb;
    double flops;
  };
  const Product products[] = {
      {{1003, 64}, {64, 48}, false, false, 2.0 * 1003 * 64 * 48},   // row blocks
      {{40, 64}, {997, 64}, false, true, 2.0 * 40 * 64 * 997},      // column blocks
      {{1003, 48}, {1003, 96}, true, false, 2.0 * 48 * 1003 * 96},  // partial products, then their sum
      {{5, 64, 32}, {5, 40, 32}, false, true, 2.0 * 5 * 64 * 32 * 40},
  };
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Product& p : products) {
      std::ostringstream what;
      what << p.a << " x " << p.b << " on " << threads << " threads";
      SCOPED_TRACE(what.str());
      const Tensor a = uniform(p.a, 30, DType::f32), b = uniform(p.b, 31, DType::f32);
      ops::count_blas(true);
      ops::matmul(a, b, p.ta, p.tb);
      const ops::BlasCount c = ops::blas_count();
      EXPECT_EQ(c.flops, p.flops);
      EXPECT_GT(c.seconds, 0.0);
      ops::count_blas(false);
      ops::matmul(a, b, p.ta, p.tb);
      EXPECT_EQ(ops::blas_count().flops, 0.0) << "counted while off";
    }
    // linear's GEMM adds onto the bias it wrote (beta = 1): the same 2 M N K.
    ops::count_blas(true);
    ops::linear(uniform({40, 1000}, 32, DType::f32), uniform({1000, 30}, 33, DType::f32),
                uniform({30}, 34, DType::f32));
    EXPECT_EQ(ops::blas_count().flops, 2.0 * 40 * 1000 * 30);
    ops::count_blas(true);  // starts again from zero
    EXPECT_EQ(ops::blas_count().flops, 0.0);
    ops::count_blas(false);
  }
}

TEST(Matmul, EmptyInnerDimensionGivesZeros) {
  Tensor c = ops::matmul(Tensor::ones({2, 0}), Tensor::ones({0, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(c.to_vector(), std::vector<double>(6, 0.0));
}

TEST(Linear, MatchesMatmulPlusBias) {
  set_num_threads(2);
  for (Shape xs : {Shape{5}, Shape{7, 5}, Shape{2, 300, 5}}) {
    Tensor x = uniform(xs, 26, DType::f64), w = uniform({5, 3}, 27, DType::f64), b = uniform({3}, 28, DType::f64);
    std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
    for (bool with_bias : {false, true}) {
      Tensor y = ops::linear(x, w, with_bias ? b : Tensor());
      Shape ys = xs;
      ys[ys.size() - 1] = 3;
      ASSERT_EQ(y.shape(), ys);
      std::vector<double> yv = y.to_vector();
      for (int64_t r = 0; r < x.numel() / 5; ++r)
        for (int64_t o = 0; o < 3; ++o) {
          double want = with_bias ? bv[size_t(o)] : 0.0;
          for (int64_t i = 0; i < 5; ++i) want += xv[size_t(r * 5 + i)] * wv[size_t(i * 3 + o)];
          ASSERT_NEAR(yv[size_t(r * 3 + o)], want, 1e-12);
        }
    }
  }
}

TEST(Matmul, BadInputsNameShapes) {
  expect_error_mentions(
      [] {
        ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
      },
      {"matmul", "inner dimensions", "(2, 3)", "(4, 5)"});
  expect_error_mentions(
      [] {
        ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 5}), true, true);
      },
      {"matmul", "(2, 3) (transposed)", "(2, 5) (transposed)"});
  expect_error_mentions(
      [] {
        ops::matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 4}));
      },
      {"matmul", "batch dimensions", "(2, 2, 3)", "(3, 3, 4)"});
  expect_error_mentions([] { ops::matmul(Tensor::zeros({3}), Tensor::zeros({3, 4})); }, {"matmul", "(3,)"});
  expect_error_mentions(
      [] {
        ops::matmul(Tensor::zeros({2, 2}, DType::i32), Tensor::zeros({2, 2}, DType::i32));
      },
      {"matmul", "i32"});
  expect_error_mentions(
      [] {
        ops::linear(Tensor::zeros({4, 3}), Tensor::zeros({5, 2}), Tensor());
      },
      {"linear", "(4, 3)", "(5, 2)"});
  expect_error_mentions(
      [] {
        ops::linear(Tensor::zeros({4, 5}), Tensor::zeros({5, 2}), Tensor::zeros({3}));
      },
      {"linear", "(2,)", "(3,)"});
}

}  // namespace
}  // namespace minidl
