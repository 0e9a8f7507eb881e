// GELU, tanh approximation (as GPT-2), and its derivative: the per-element math shared by the CPU and CUDA
// kernels of ops/gelu.h.
//
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace minidl::ops::kernels {

template <class T>
MINIDL_HD T gelu_tanh(T x) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);  // sqrt(2/pi), GPT-2's cubic coefficient
  T u = k0 * (x + k1 * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

// d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class T>
MINIDL_HD T gelu_tanh_grad(T x) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);
  T x2 = x * x;
  T t = std::tanh(k0 * (x + k1 * x2 * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k0 * (T(1) + T(3) * k1 * x2);
}

}  // namespace minidl::ops::kernels
