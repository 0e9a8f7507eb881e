// GELU (tanh approximation, as GPT-2) and the fused bias + GELU of the MLP, without autograd.
// The per-element math is ops/kernels/gelu.h.
//
//   Tensor h = ops::bias_gelu_forward(x, b);           // gelu(x + b), x: (..., C), b: (C)
//   auto [dx, db] = ops::bias_gelu_backward(dh, x, b);
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// x: any shape, f32/f64, or f16/bf16 (computed in f32, result rounded to x's dtype).
Tensor gelu_forward(const Tensor& x);
// dy like x -> dx = dy * gelu'(x).
Tensor gelu_backward(const Tensor& dy, const Tensor& x);

// x: (..., C); bias: (C) -> gelu(x + bias), like x. The sum x + bias is never stored: backward recomputes it.
Tensor bias_gelu_forward(const Tensor& x, const Tensor& bias);

struct BiasGeluBackward {
  Tensor dx;     // like x
  Tensor dbias;  // (C): dx summed over rows (fixed row blocks, then in order: thread-count independent)
};
BiasGeluBackward bias_gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& bias);

// The CUDA kernels (ops/cuda/tensor/gelu.cpp: f32, f16 and bf16 storage read directly, math in f32), filled by
// minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&)> gelu_forward_device{"gelu"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> gelu_backward_device{"gelu_backward"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> bias_gelu_forward_device{"bias_gelu"};
inline DeviceKernel<BiasGeluBackward(const Tensor&, const Tensor&, const Tensor&)> bias_gelu_backward_device{
    "bias_gelu_backward"};

// ---- argument checks, shared by every backend's entry ----
// Returns C.
inline int64_t check_bias_gelu(const char* op, const Tensor& x, const Tensor& bias) {
  check_float_or_half(op, "x", x);
  MINIDL_CHECK(x.dim() >= 1, op, ": expected x of shape (..., C), got ", x.shape());
  check_shaped_like(op, "bias", bias, Shape{x.size(-1)}, x);
  return x.size(-1);
}

}  // namespace minidl::ops
