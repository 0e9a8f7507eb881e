// Fused RMS norm over the last dimension (Llama's), without autograd.
//
//   auto [y, rstd] = ops::rmsnorm_forward(x, w, 1e-5);   // x: (..., C), w: (C)
//   auto [dx, dw] = ops::rmsnorm_backward(dy, x, w, rstd);
//
// As transformers' LlamaRMSNorm computes it: x is taken in f32, xhat = x * rsqrt(mean(x^2) + eps), xhat is cast
// back to x's dtype, and only then multiplied by the weight (transformers #30236):
//
//   y = round(round(xhat) * w)     round: to x's dtype (the identity for f32 and f64)
//
// For 16-bit x the two roundings differ from one rounding of xhat * w in about one element in three (bf16).
// eps has no default: it comes from the model's config (1e-5 and 1e-6 are both common).
//
// Forward saves only rstd (one number per row); backward recomputes xhat. The cast is the identity for the
// gradient (as in PyTorch's autograd): with g = dy * w,
//   dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * round(xhat).
// 16-bit x: y and dx in x's dtype (rounded once each), weight, rstd and dweight in f32.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/layernorm.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

struct RMSNormForward {
  Tensor y;     // (..., C), like x
  Tensor rstd;  // (rows) = x.numel() / C, in layernorm_param_dtype(x): 1 / sqrt(mean(x^2) + eps)
};

// x: (..., C); weight: (C) in layernorm_param_dtype(x) (x's own, f32 for 16-bit x); eps > 0.
RMSNormForward rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps);

struct RMSNormBackward {
  Tensor dx;       // like x
  Tensor dweight;  // (C), weight's dtype
};

// dy: like x. dweight is summed over rows in fixed blocks of rows, then the blocks in order: no races, and the same
// bits whatever the thread count.
RMSNormBackward rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd);

// The CUDA kernels (ops/cuda/tensor/rmsnorm.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<RMSNormForward(const Tensor&, const Tensor&, double)> rmsnorm_forward_device{"rmsnorm"};
inline DeviceKernel<RMSNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>
    rmsnorm_backward_device{"rmsnorm_backward"};

}  // namespace minidl::ops
