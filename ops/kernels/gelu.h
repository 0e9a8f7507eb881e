// GELU, tanh approximation (as GPT-2), and its derivative: the per-element math shared by the CPU and CUDA
// kernels of ops/gelu.h.
//
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//
// Written with the identity 0.5 (1 + tanh u) = sigmoid(2u) = 1 / (1 + exp(-2u)): one exp instead of a tanh (which
// libm does not vectorise), and no cancellation for large negative x, where 1 + tanh(u) loses every digit.
// `exp_fn` lets each backend supply its fastest exp (the CPU passes a vectorisable one, CUDA its intrinsic).
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace minidl::ops::kernels {

struct StdExp {
  template <class T>
  MINIDL_HD T operator()(T x) const {
    return std::exp(x);
  }
};

// sigmoid(2u) for the GELU argument u(x).
template <class T, class Exp>
MINIDL_HD T gelu_gate(T x, Exp exp_fn) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);  // sqrt(2/pi), GPT-2's cubic coefficient
  T u = k0 * (x + k1 * x * x * x);
  return T(1) / (T(1) + exp_fn(T(-2) * u));
}

template <class T, class Exp = StdExp>
MINIDL_HD T gelu_tanh(T x, Exp exp_fn = {}) {
  return x * gelu_gate(x, exp_fn);
}

// d gelu / dx = s + x s (1 - s) 2 du/dx with s = sigmoid(2u), du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (the same as 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx).
template <class T, class Exp = StdExp>
MINIDL_HD T gelu_tanh_grad(T x, Exp exp_fn = {}) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);
  T s = gelu_gate(x, exp_fn);
  return s + T(2) * x * s * (T(1) - s) * k0 * (T(1) + T(3) * k1 * x * x);
}

}  // namespace minidl::ops::kernels
