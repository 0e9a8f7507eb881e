// Softmax over the last dimension, without autograd: the plain reference path (the model itself uses the fused
// cross-entropy and attention ops, which never store probabilities for backward).
//
//   Tensor p = ops::softmax_forward(x);             // x: (..., V)
//   Tensor dx = ops::softmax_backward(dp, p);
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// x: (..., V), f32/f64, V >= 1 -> probabilities, like x (max-subtracted, so large logits do not overflow).
Tensor softmax_forward(const Tensor& x);
// dy, y: like the forward output -> dx = y * (dy - sum(dy * y)) per row.
Tensor softmax_backward(const Tensor& dy, const Tensor& y);

// The CUDA kernels (ops/cuda/tensor/softmax.cpp, f32), filled by minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&)> softmax_forward_device{"softmax"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> softmax_backward_device{"softmax_backward"};

// ---- argument checks, shared by every backend's entry ----
inline void check_softmax(const Tensor& x) {
  check_float("softmax", "x", x);
  MINIDL_CHECK(x.dim() >= 1 && x.size(-1) > 0, "softmax: expected x of shape (..., V) with V > 0, got ", x.shape());
}

}  // namespace minidl::ops
