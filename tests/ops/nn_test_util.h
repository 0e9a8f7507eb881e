// Helpers shared by the neural-network op tests: random inputs, tolerant comparison with a double-precision
// reference, running forward + backward with a chosen output gradient, and error-message checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace minidl::testing {

using Values = std::vector<double>;

// N(0, 1) * scale values from Philox(seed).
inline Values random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  Philox rng(seed, 7);
  Values v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * rng.normal(uint64_t(i));
  return v;
}

// A random float tensor of `dtype`; its values (after rounding to dtype) are what a reference must read.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  return Tensor::from_vector(random_values(shape.numel(), seed, scale), shape, dtype);
}

// random_tensor as a leaf that requires grad: an input a gradient check differentiates against.
inline Tensor grad_leaf(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  Tensor t = random_tensor(shape, seed, dtype, scale);
  t.set_requires_grad(true);
  return t;
}

// |got - want| <= rtol * max|want| elementwise: relative to the tensor's scale, so entries near zero are held to
// the same absolute accuracy as the large ones.
inline void expect_close(const Values& got, const Values& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * scale) << what << " element " << i << " (scale " << scale << ")";
}

struct ForwardBackward {
  Values out;                // f(inputs)
  std::vector<Values> grad;  // d sum(f * R) / d input, per input (empty for inputs without grad)
};

// Clears the inputs' gradients, runs f and backward with output gradient R (converted to f's output dtype).
inline ForwardBackward forward_backward(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                        std::vector<Tensor> inputs, const Values& R) {
  for (Tensor& t : inputs) t.set_grad(Tensor());
  Tensor out = f(inputs);
  Tensor r = Tensor::from_vector(R, out.shape(), out.dtype());
  autograd::backward({out}, {r});
  ForwardBackward fb{out.to_vector(), {}};
  for (const Tensor& t : inputs) fb.grad.push_back(t.requires_grad() ? t.grad().to_vector() : Values{});
  return fb;
}

// Expects fn to throw minidl::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace minidl::testing
