// Elementwise kernels (no autograd): binary ops with NumPy broadcasting, scalar ops, unary math, in-place
// accumulation, and the broadcast helpers that autograd uses to route gradients back to an input's shape.
//
//   Tensor y = ops::add(x, bias);                 // x: (B, T, C), bias: (C) -> (B, T, C)
//   Tensor gb = ops::sum_to_shape(gy, bias.shape()); // (B, T, C) -> (C), the bias gradient
//
// All results are new contiguous tensors. Inputs may have any strides (views); float kernels accept f32 and f64,
// and f16/bf16 (computed in f32, the result rounded to the inputs' dtype); the operands of a binary op must share
// dtype and device. On CUDA devices: f32, f16 and bf16 (add_: f32), no f64.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// The shape of broadcasting a with b (NumPy rules: align trailing dimensions; sizes must match or be 1).
// Throws naming `op` and both shapes when they cannot be broadcast.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Strides that view t as a tensor of `shape` (t broadcastable to it): 0 on broadcast dimensions.
Strides broadcast_strides(const Tensor& t, const Shape& shape);

// ---- binary, broadcasting: the result has the broadcast shape and the inputs' dtype ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// ---- with a scalar ----
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);

// ---- unary ----
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor square(const Tensor& a);
// grad * (1 - y^2), the backward of y = tanh(x), in one pass. grad, y: same shape.
Tensor tanh_backward(const Tensor& grad, const Tensor& y);

// dst += src (same shape; dst contiguous, f32 or f64; src any strides, converted if its dtype differs; on a CUDA
// device dst is f32 and src f32, f16 or bf16).
// Used to accumulate gradients.
void add_(Tensor& dst, const Tensor& src);

// t materialised at `shape` (t must broadcast to it): the backward of a reduction.
Tensor broadcast_to(const Tensor& t, const Shape& shape);
// Sums grad over the dimensions that broadcasting added or stretched, giving `shape` (which must broadcast to
// grad's shape). Returns grad itself when the shapes are equal. The backward of a broadcasting op.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

// ---- the CUDA kernels (ops/cuda/tensor/elementwise.cpp), filled by minidl::cuda::register_backend() ----
// Each entry above validates its arguments, then hands device tensors to its table.
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> add_device{"add"}, sub_device{"sub"}, mul_device{"mul"},
    div_device{"div"}, tanh_backward_device{"tanh_backward"};
inline DeviceKernel<Tensor(const Tensor&, double)> add_scalar_device{"add"}, mul_scalar_device{"mul"};
inline DeviceKernel<Tensor(const Tensor&)> neg_device{"neg"}, exp_device{"exp"}, log_device{"log"}, tanh_device{"tanh"},
    sqrt_device{"sqrt"}, square_device{"square"};
inline DeviceKernel<void(Tensor&, const Tensor&)> add_inplace_device{"add_"};
inline DeviceKernel<Tensor(const Tensor&, const Shape&)> broadcast_to_device{"broadcast_to"},
    sum_to_shape_device{"sum_to_shape"};

}  // namespace minidl::ops
