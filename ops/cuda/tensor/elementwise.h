// Helpers of the ops' CUDA entries that work on Tensors of any float storage (ops/cuda/tensor/): the elementwise
// launchers on Tensors, contiguous copies, and the f32 round trip of the f16/bf16 ops that compute in f32.
// Internal to the CUDA backend libraries.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/elementwise.h"

namespace minidl::ops::cuda {

// Throws "<op>: the CUDA kernel takes <what>, got <dtype> on <device>" unless t's dtype is f32 (or, with
// half_too, f16 or bf16).
void check_cuda_dtype(const char* op, const Tensor& t, bool half_too);

// out (contiguous, `shape`) = op(x) / op(a, b), the inputs viewed at `shape` with broadcast strides; f32, f16 or
// bf16 storage (all operands the same), computed in f32.
Tensor unary_on_device(const char* op_name, UnaryOp op, const Tensor& x, const Shape& shape, float scalar = 0.0f);
Tensor binary_on_device(const char* op_name, BinaryOp op, const Tensor& a, const Tensor& b);

// t itself when contiguous, else a contiguous device copy (float storage copied by a kernel, other dtypes through
// the host).
Tensor contiguous_on_device(const Tensor& t);

// The f32 copy of a 16-bit device tensor (contiguous), and back (round to nearest even).
Tensor upcast_on_device(const Tensor& t);
Tensor downcast_on_device(const Tensor& t32, DType dtype);

}  // namespace minidl::ops::cuda
