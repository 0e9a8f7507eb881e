// Fused layer norm over the last dimension, without autograd.
//
//   auto [y, mean, rstd] = ops::layernorm_forward(x, w, b, 1e-5);   // x: (..., C)
//   auto [dx, dw, db] = ops::layernorm_backward(dy, x, w, mean, rstd);
//
// Forward is one pass per row; it saves only the row statistics (2 numbers per row) for backward, which
// recomputes xhat = (x - mean) * rstd instead of keeping a normalised copy of x.
//
// 16-bit x (f16, bf16 storage: the residual stream under autocast) is normalised in f32 with f32 weight and bias:
// y and dx come out in x's dtype (each element rounded once), mean, rstd, dweight and dbias in f32.
#pragma once

#include "core/tensor.h"
#include "ops/cast.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

struct LayerNormForward {
  Tensor y;  // (..., C), like x
  Tensor
      mean;  // (rows) = x.numel() / C, in layernorm_param_dtype(x) (f32 in training; f64 keeps gradient checks exact)
  Tensor rstd;  // (rows): 1 / sqrt(var + eps), var the biased (population) variance
};

// x: (..., C); weight, bias: (C) in layernorm_param_dtype(x).
LayerNormForward layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

struct LayerNormBackward {
  Tensor dx;       // like x
  Tensor dweight;  // (C), weight's dtype
  Tensor dbias;    // (C), weight's dtype
};

// dweight and dbias are summed over rows in fixed blocks of rows, then the blocks in order: no races, and the
// same bits whatever the thread count.
LayerNormBackward layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd);

// The CUDA kernels (ops/cuda/tensor/layernorm.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<LayerNormForward(const Tensor&, const Tensor&, const Tensor&, double)> layernorm_forward_device{
    "layernorm"};
inline DeviceKernel<LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&)>
    layernorm_backward_device{"layernorm_backward"};

// The residual add fused into the layer norm that reads it (the GPT block's y = x + attn(ln_1(x)) feeding ln_2):
// one pass over the rows instead of an add and a layernorm, with the same arithmetic as the two ops.
//
//   auto [s, y, mean, rstd] = ops::add_layernorm_forward(a, b, w, bias, 1e-5);    // s = a + b, y = layernorm(s)
//   auto [ds, dw, db] = ops::add_layernorm_backward(dy, dsum, s, w, mean, rstd);  // ds = da = db
struct AddLayerNormForward {
  Tensor sum;   // a + b, a's dtype (rounded once, as ops::add)
  Tensor y;     // layernorm(sum), like LayerNormForward
  Tensor mean;  // (rows)
  Tensor rstd;  // (rows)
};

// a, b: (..., C), the same shape and dtype; weight, bias: (C) in layernorm_param_dtype(a).
AddLayerNormForward add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                          double eps);
// dy: the gradient of y; dsum: the gradient of sum from its other uses (the residual stream), or undefined.
// dx = layernorm_backward(dy, sum, ...).dx + dsum, the gradient of sum and so of a and of b; dweight, dbias as
// layernorm_backward.
LayerNormBackward add_layernorm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& weight,
                                         const Tensor& mean, const Tensor& rstd);

inline DeviceKernel<AddLayerNormForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double)>
    add_layernorm_forward_device{"add_layernorm"};
inline DeviceKernel<LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&)>
    add_layernorm_backward_device{"add_layernorm_backward"};

// ---- argument checks, shared by every backend's entry ----
// The dtype of weight, bias, mean and rstd for x: x's own, f32 for 16-bit x.
inline DType layernorm_param_dtype(const Tensor& x) { return is_half(x.dtype()) ? DType::f32 : x.dtype(); }

// A (C) or (rows) tensor of layernorm_param_dtype(x), on x's device.
inline void check_layernorm_param(const char* op, const char* name, const Tensor& t, const Shape& shape,
                                  const Tensor& x) {
  check_contiguous(op, name, t);
  MINIDL_CHECK(t.dtype() == layernorm_param_dtype(x), op, ": expected ", name, " to have dtype ",
               layernorm_param_dtype(x), " for x of dtype ", x.dtype(), ", got ", t.dtype());
  MINIDL_CHECK(t.device() == x.device(), op, ": expected ", name, " on ", x.device(), ", got ", t.device());
  MINIDL_CHECK(t.shape() == shape, op, ": expected ", name, " of shape ", shape, ", got ", t.shape());
}

// x: (..., C), weight: (C); returns C. The forward also checks bias like weight.
inline int64_t check_layernorm(const char* op, const Tensor& x, const Tensor& weight) {
  check_float_or_half(op, "x", x);
  MINIDL_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": expected x of shape (..., C) with C > 0, got ", x.shape());
  int64_t C = x.size(-1);
  check_layernorm_param(op, "weight", weight, Shape{C}, x);
  return C;
}

}  // namespace minidl::ops
