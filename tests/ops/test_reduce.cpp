// Reductions against naive double references, over every dimension, with keepdim, views and threads.
#include <gtest/gtest.h>

#include <cmath>

#include "core/parallel.h"
#include "ops/reduce.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::expect_error_mentions;
using testing::uniform;
using testing::unravel;

// Flat index in the reduced (keepdim) shape of input index idx.
int64_t reduced_flat(std::vector<int64_t> idx, const Shape& keep) {
  int64_t flat = 0;
  for (int d = 0; d < keep.size(); ++d) flat = flat * keep[d] + (keep[d] == 1 ? 0 : idx[size_t(d)]);
  return flat;
}

void expect_dim_reductions_match(const Tensor& x) {
  std::vector<double> xv = x.to_vector();
  double tol = x.dtype() == DType::f32 ? 2e-5 : 1e-12;
  for (int d = 0; d < x.dim(); ++d) {
    Shape keep = ops::reduced_shape(x.shape(), d, true);
    std::vector<double> sum(size_t(keep.numel()), 0.0), best(size_t(keep.numel()), -INFINITY);
    std::vector<int64_t> arg(size_t(keep.numel()), -1);
    for (int64_t i = 0; i < x.numel(); ++i) {
      std::vector<int64_t> idx = unravel(i, x.shape());
      size_t k = size_t(reduced_flat(idx, keep));
      sum[k] += xv[size_t(i)];
      if (xv[size_t(i)] > best[k]) best[k] = xv[size_t(i)], arg[k] = idx[size_t(d)];
    }
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << x.shape() << " dim " << d << " keepdim " << keepdim);
      Shape want_shape = ops::reduced_shape(x.shape(), d, keepdim);
      Tensor s = ops::sum(x, d, keepdim), m = ops::mean(x, d, keepdim);
      ops::MaxResult mx = ops::max(x, d - x.dim(), keepdim);  // negative dim
      ASSERT_EQ(s.shape(), want_shape);
      ASSERT_EQ(m.shape(), want_shape);
      ASSERT_EQ(mx.values.shape(), want_shape);
      ASSERT_EQ(mx.indices.dtype(), DType::i64);
      std::vector<double> sv = s.to_vector(), mv = m.to_vector(), vv = mx.values.to_vector(),
                          iv = mx.indices.to_vector();
      for (size_t k = 0; k < sum.size(); ++k) {
        ASSERT_NEAR(sv[k], sum[k], tol * std::max(1.0, std::abs(sum[k])));
        ASSERT_NEAR(mv[k], sum[k] / double(x.size(d)), tol);
        ASSERT_EQ(vv[k], best[k]);
        ASSERT_EQ(iv[k], double(arg[k]));
      }
    }
  }
}

TEST(Reduce, OverOneDimMatchesNaive) {
  for (DType dt : {DType::f32, DType::f64}) {
    expect_dim_reductions_match(uniform({7}, 1, dt));
    expect_dim_reductions_match(uniform({3, 5}, 2, dt));
    expect_dim_reductions_match(uniform({2, 3, 4}, 3, dt));
    expect_dim_reductions_match(uniform({2, 1, 3, 2}, 4, dt));
    expect_dim_reductions_match(uniform({4, 6}, 5, dt).detach().transpose(0, 1));  // strided input
  }
}

TEST(Reduce, ThreadedDimReductionsMatchNaive) {
  set_num_threads(2);
  expect_dim_reductions_match(uniform({300, 257}, 6, DType::f32));  // both rows and columns split
  expect_dim_reductions_match(uniform({2, 3000, 19}, 7, DType::f64));
}

TEST(Reduce, AllElementsMatchNaive) {
  set_num_threads(2);
  for (DType dt : {DType::f32, DType::f64}) {
    for (Shape s : {Shape{}, Shape{5}, Shape{3, 4}, Shape{200003}}) {
      Tensor x = uniform(s, 8, dt);
      std::vector<double> v = x.to_vector();
      double sum = 0, best = -INFINITY;
      for (double e : v) sum += e, best = std::max(best, e);
      ASSERT_EQ(ops::sum(x).shape(), Shape{});
      EXPECT_NEAR(ops::sum(x).item(), sum, 1e-6 * std::max(1.0, std::abs(sum))) << s;
      EXPECT_NEAR(ops::mean(x).item(), sum / double(v.size()), 1e-7) << s;
      EXPECT_EQ(ops::max(x).item(), best) << s;
    }
  }
}

TEST(Reduce, MaxPicksFirstMaximumAndPropagatesNaN) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 3, 3, 2, 5, NAN, 0, 5}, {2, 4}, DType::f64);
  ops::MaxResult r = ops::max(x, 1);
  EXPECT_EQ(r.indices.to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(r.values.to_vector()[0], 3.0);
  EXPECT_TRUE(std::isnan(r.values.to_vector()[1]));
  EXPECT_TRUE(std::isnan(ops::max(x).item()));
}

TEST(Reduce, MaxBackwardScattersToIndices) {
  Tensor g = Tensor::from_vector(std::vector<double>{10, 20, 30}, {3}, DType::f64);
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 0, 1}, {3});
  // input (2, 3) reduced over dim 0: column c gets g[c] at row idx[c].
  EXPECT_EQ(ops::max_backward(g, idx, {2, 3}, 0).to_vector(), (std::vector<double>{0, 20, 0, 10, 0, 30}));
}

TEST(Reduce, BadInputsNameShapes) {
  expect_error_mentions([] { ops::max(Tensor::zeros({2, 0}), 1); }, {"max", "(2, 0)"});
  expect_error_mentions([] { ops::sum(Tensor::zeros({2, 3}), 2); }, {"dimension 2", "(2, 3)"});
  expect_error_mentions([] { ops::sum(Tensor::zeros({2}, DType::i64)); }, {"sum", "i64"});
}

}  // namespace
}  // namespace minidl
