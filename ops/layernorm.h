// Fused layer norm over the last dimension, without autograd.
//
//   auto [y, mean, rstd] = ops::layernorm_forward(x, w, b, 1e-5);   // x: (..., C)
//   auto [dx, dw, db] = ops::layernorm_backward(dy, x, w, mean, rstd);
//
// Forward is one pass per row; it saves only the row statistics (2 numbers per row) for backward, which
// recomputes xhat = (x - mean) * rstd instead of keeping a normalised copy of x.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

struct LayerNormForward {
  Tensor y;     // (..., C), like x
  Tensor mean;  // (rows) = x.numel() / C, in x's dtype (f32 in training; f64 keeps gradient checks exact)
  Tensor rstd;  // (rows): 1 / sqrt(var + eps), var the biased (population) variance
};

// x: (..., C); weight, bias: (C); all the same float dtype.
LayerNormForward layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

struct LayerNormBackward {
  Tensor dx;       // like x
  Tensor dweight;  // (C)
  Tensor dbias;    // (C)
};

// dweight and dbias are summed over rows in fixed blocks of rows, then the blocks in order: no races, and the
// same bits whatever the thread count.
LayerNormBackward layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd);

// ---- argument checks, shared by every backend's entry ----
// x: (..., C), weight: (C); returns C. The forward also checks bias like weight.
// The CUDA kernels (ops/cuda/tensor/layernorm.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<LayerNormForward(const Tensor&, const Tensor&, const Tensor&, double)> layernorm_forward_device{
    "layernorm"};
inline DeviceKernel<LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&)>
    layernorm_backward_device{"layernorm_backward"};

inline int64_t check_layernorm(const char* op, const Tensor& x, const Tensor& weight) {
  check_float(op, "x", x);
  MINIDL_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": expected x of shape (..., C) with C > 0, got ", x.shape());
  int64_t C = x.size(-1);
  check_shaped_like(op, "weight", weight, Shape{C}, x);
  return C;
}

}  // namespace minidl::ops
