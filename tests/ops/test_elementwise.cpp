// Elementwise kernels against naive double references: broadcasting, strided views, the threaded paths.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/parallel.h"
#include "ops/elementwise.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::broadcast_source;
using testing::expect_error_mentions;
using testing::uniform;
using testing::unravel;

using BinaryKernel = Tensor (*)(const Tensor&, const Tensor&);
struct BinaryCase {
  const char* name;
  BinaryKernel kernel;
  std::function<double(double, double)> ref;
};
const BinaryCase kBinary[] = {
    {"add", ops::add, [](double x, double y) { return x + y; }},
    {"sub", ops::sub, [](double x, double y) { return x - y; }},
    {"mul", ops::mul, [](double x, double y) { return x * y; }},
    {"div", ops::div, [](double x, double y) { return x / y; }},
};

// Checks every binary op on (a, b) against the naive broadcast reference.
void expect_binary_matches(const Tensor& a, const Tensor& b, const Shape& expected_shape) {
  std::vector<double> av = a.to_vector(), bv = b.to_vector();
  double tol = a.dtype() == DType::f32 ? 1e-6 : 1e-14;
  for (const BinaryCase& c : kBinary) {
    Tensor out = c.kernel(a, b);
    ASSERT_EQ(out.shape(), expected_shape) << c.name;
    ASSERT_TRUE(out.is_contiguous());
    std::vector<double> ov = out.to_vector();
    for (int64_t i = 0; i < out.numel(); ++i) {
      std::vector<int64_t> idx = unravel(i, expected_shape);
      double want = c.ref(av[size_t(broadcast_source(idx, a.shape()))], bv[size_t(broadcast_source(idx, b.shape()))]);
      ASSERT_NEAR(ov[size_t(i)], want, tol * std::max(1.0, std::abs(want))) << c.name << " element " << i;
    }
  }
}

TEST(Elementwise, BroadcastingMatchesNaive) {
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {
      {{2, 3, 4}, {4}, {2, 3, 4}}, {{2, 1, 4}, {3, 1}, {2, 3, 4}}, {{5}, {5}, {5}},
      {{}, {3, 2}, {3, 2}},        {{1}, {2, 3}, {2, 3}},          {{4, 1, 3}, {1, 5, 1}, {4, 5, 3}},
      {{3, 1}, {1, 1}, {3, 1}},    {{2, 0, 3}, {3}, {2, 0, 3}},
  };
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << c.a << " op " << c.b << " " << dt);
      // b stays away from 0 so div is well conditioned.
      expect_binary_matches(uniform(c.a, 1, dt), uniform(c.b, 2, dt, 0.5, 2.0), c.out);
    }
  }
}

TEST(Elementwise, ThreadedPathsMatchNaive) {
  set_num_threads(2);
  // A flat contiguous run split into chunks, and many broadcast rows split by rows.
  expect_binary_matches(uniform({100003}, 3, DType::f32), uniform({100003}, 4, DType::f32, 0.5, 2.0), {100003});
  expect_binary_matches(uniform({97, 1031}, 5, DType::f32), uniform({1031}, 6, DType::f32, 0.5, 2.0), {97, 1031});
  expect_binary_matches(uniform({1031}, 7, DType::f64), uniform({97, 1}, 8, DType::f64, 0.5, 2.0), {97, 1031});
}

TEST(Elementwise, StridedViewsMatchNaive) {
  Tensor base = uniform({4, 6}, 9, DType::f64);
  Tensor at = base.detach().transpose(0, 1);                                       // (6, 4), non-contiguous
  Tensor bn = uniform({6, 8}, 10, DType::f64, 0.5, 2.0).detach().narrow(1, 2, 4);  // (6, 4), row stride 8
  ASSERT_FALSE(at.is_contiguous());
  ASSERT_FALSE(bn.is_contiguous());
  expect_binary_matches(at, bn, {6, 4});
  expect_binary_matches(at, bn.narrow(0, 1, 1), {6, 4});  // (1, 4) strided, broadcast over rows
}

TEST(Elementwise, UnaryAndScalarMatchStd) {
  using UnaryKernel = Tensor (*)(const Tensor&);
  struct Case {
    const char* name;
    UnaryKernel kernel;
    std::function<double(double)> ref;
  };
  const Case cases[] = {
      {"neg", ops::neg, [](double x) { return -x; }},
      {"exp", ops::exp, [](double x) { return std::exp(x); }},
      {"log", ops::log, [](double x) { return std::log(x); }},
      {"tanh", ops::tanh, [](double x) { return std::tanh(x); }},
      {"sqrt", ops::sqrt, [](double x) { return std::sqrt(x); }},
      {"square", ops::square, [](double x) { return x * x; }},
      {"add 2.5", [](const Tensor& t) { return ops::add(t, 2.5); }, [](double x) { return x + 2.5; }},
      {"mul -3", [](const Tensor& t) { return ops::mul(t, -3.0); }, [](double x) { return -3.0 * x; }},
  };
  for (DType dt : {DType::f32, DType::f64}) {
    double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    // Positive inputs (log, sqrt); a transposed view exercises the strided path; 70000 the threaded one.
    for (Tensor x : {uniform({3, 5}, 11, dt, 0.1, 3.0).detach().transpose(0, 1), uniform({70000}, 12, dt, 0.1, 3.0)}) {
      std::vector<double> xv = x.to_vector();
      for (const Case& c : cases) {
        Tensor y = c.kernel(x);
        ASSERT_EQ(y.shape(), x.shape()) << c.name;
        std::vector<double> yv = y.to_vector();
        for (size_t i = 0; i < xv.size(); ++i)
          ASSERT_NEAR(yv[i], c.ref(xv[i]), tol * std::max(1.0, std::abs(c.ref(xv[i])))) << c.name << " " << dt;
      }
    }
  }
}

TEST(Elementwise, TanhBackwardIsGradTimesOneMinusSquare) {
  Tensor g = Tensor::from_vector(std::vector<double>{2.0, -1.0}, {2}, DType::f64);
  Tensor y = Tensor::from_vector(std::vector<double>{0.5, 0.0}, {2}, DType::f64);
  EXPECT_EQ(ops::tanh_backward(g, y).to_vector(), (std::vector<double>{1.5, -1.0}));
}

TEST(Elementwise, InPlaceAddAcceptsStridedSource) {
  Tensor dst = uniform({3, 4}, 13, DType::f32);
  std::vector<double> before = dst.to_vector();
  Tensor src = uniform({4, 3}, 14, DType::f32).detach().transpose(0, 1);
  std::vector<double> sv = src.to_vector();
  ops::add_(dst, src);
  std::vector<double> after = dst.to_vector();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], float(float(before[i]) + float(sv[i])));
  ops::add_(dst, Tensor::ones({3, 4}, DType::f64));  // another dtype is converted
  EXPECT_FLOAT_EQ(float(dst.to_vector()[0]), float(after[0] + 1.0));
}

TEST(Elementwise, SumToShapeReducesBroadcastDims) {
  Tensor g = uniform({2, 3, 4}, 15, DType::f64);
  std::vector<double> gv = g.to_vector();
  for (Shape target : {Shape{4}, Shape{3, 1}, Shape{2, 1, 4}, Shape{1, 3, 4}, Shape{}, Shape{1}}) {
    Tensor s = ops::sum_to_shape(g, target);
    ASSERT_EQ(s.shape(), target);
    std::vector<double> want(size_t(target.numel()), 0.0);
    for (int64_t i = 0; i < g.numel(); ++i)
      want[size_t(broadcast_source(unravel(i, g.shape()), target))] += gv[size_t(i)];
    std::vector<double> got = s.to_vector();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << target << " element " << i;
  }
  EXPECT_TRUE(ops::sum_to_shape(g, g.shape()).same(g));
}

TEST(Elementwise, BroadcastToRepeats) {
  Tensor t = Tensor::from_vector(std::vector<double>{1, 2}, {2, 1}, DType::f64);
  EXPECT_EQ(ops::broadcast_to(t, {2, 2, 3}).to_vector(), (std::vector<double>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2}));
}

TEST(Elementwise, BadInputsNameShapesAndDtypes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  expect_error_mentions([&] { ops::add(a, b); }, {"add", "(2, 3)", "(4,)", "cannot be broadcast"});
  expect_error_mentions(
      [&] {
        ops::mul(Tensor::zeros({2, 1, 4}), Tensor::zeros({3, 2}));
      },
      {"mul", "(2, 1, 4)", "(3, 2)"});
  expect_error_mentions([&] { ops::add(Tensor::zeros({2}, DType::i64), Tensor::zeros({2}, DType::i64)); },
                        {"add", "i64"});
  expect_error_mentions([&] { ops::exp(Tensor::zeros({2}, DType::i32)); }, {"exp", "i32"});
  expect_error_mentions([&] { ops::sub(Tensor::zeros({2}), Tensor::zeros({2}, DType::f64)); }, {"sub", "f32", "f64"});
  expect_error_mentions([&] { ops::sum_to_shape(Tensor::zeros({2, 3}), {4}); }, {"sum_to_shape", "(4,)", "(2, 3)"});
  Tensor dst = Tensor::zeros({2, 2});
  expect_error_mentions([&] { ops::add_(dst, Tensor::zeros({4})); }, {"add_", "(2, 2)", "(4,)"});
}

}  // namespace
}  // namespace minidl
