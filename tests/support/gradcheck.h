// Float64 central-difference gradient check, shared by every op test.
//
//   auto f = [](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2]); };
//   expect_gradients_match(f, {x, w, b});   // x, w, b: f64 tensors; those with requires_grad are checked
//
// The analytic side runs backward with a random output gradient R; the numeric side differentiates
// sum(f(inputs) * R) by central differences, one input element at a time.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/node.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace minidl::testing {

// A f64 tensor with N(0, 1) * scale entries from Philox(seed).
inline Tensor randn64(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Philox rng(seed, 99);
  std::vector<double> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng.normal(i);
  return Tensor::from_vector(v, shape, DType::f64);
}

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline void expect_gradients_match(const TensorFn& f, std::vector<Tensor> inputs, double eps = 1e-6,
                                   double tol = 1e-6) {
  for (Tensor& t : inputs) t.set_grad(Tensor());
  Tensor out = f(inputs);
  ASSERT_EQ(out.dtype(), DType::f64) << "gradcheck runs in float64";
  Tensor R = randn64(out.shape(), 12345);
  std::vector<double> r = R.to_vector();
  autograd::backward({out}, {R});

  // The numeric side runs thousands of small forwards: one thread, so that two test processes sharing the cores do
  // not spend their time waking each other's thread teams.
  const int threads = num_threads();
  set_num_threads(1);
  struct RestoreThreads {
    int n;
    ~RestoreThreads() { set_num_threads(n); }
  } restore{threads};
  auto objective = [&]() {
    autograd::NoGradGuard no_grad;
    std::vector<double> o = f(inputs).to_vector();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * r[i];
    return s;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " received no gradient";
    ASSERT_TRUE(x.is_contiguous());
    std::vector<double> analytic = x.grad().to_vector();
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double saved = p[i];
      p[i] = saved + eps;
      double up = objective();
      p[i] = saved - eps;
      double down = objective();
      p[i] = saved;
      double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(analytic[size_t(i)], numeric, tol * std::max(1.0, std::abs(numeric)))
          << "input " << k << " element " << i;
    }
  }
}

}  // namespace minidl::testing
