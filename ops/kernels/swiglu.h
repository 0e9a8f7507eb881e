// SwiGLU's per-element math (ops/swiglu.h), shared by the CPU's scalar path and the CUDA kernels:
//   silu(g) = g sigmoid(g), out = silu(g) u;
//   d out / d g = u s (1 + g (1 - s)), d out / d u = silu(g), s = sigmoid(g).
// The sigmoid takes e = exp(-|g|) <= 1, so no exp overflows: s = 1 / (1 + e) for g >= 0, e / (1 + e) below.
// `exp_fn` lets each backend supply its exp (ops/kernels/gelu.h's StdExp on the CPU, expf on CUDA).
#pragma once

#include "core/host_device.h"
#include "ops/kernels/gelu.h"

namespace minidl::ops::kernels {

template <class T, class Exp = StdExp>
MINIDL_HD T sigmoid(T g, Exp exp_fn = {}) {
  const T e = exp_fn(g < T(0) ? g : -g);
  const T q = T(1) / (T(1) + e);
  return g < T(0) ? e * q : q;
}

template <class T, class Exp = StdExp>
MINIDL_HD T swiglu(T g, T u, Exp exp_fn = {}) {
  return g * sigmoid(g, exp_fn) * u;
}

// Both partial derivatives, times dy.
template <class T, class Exp = StdExp>
MINIDL_HD void swiglu_grad(T dy, T g, T u, T* dg, T* du, Exp exp_fn = {}) {
  const T s = sigmoid(g, exp_fn);
  *dg = dy * u * s * (T(1) + g * (T(1) - s));
  *du = dy * g * s;
}

}  // namespace minidl::ops::kernels
