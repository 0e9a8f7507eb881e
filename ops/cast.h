// Conversions between f32 and the 16-bit float storage types (f16, bf16), without autograd — the building block
// of mixed precision (autograd/autocast.h).
//
//   Tensor h = ops::cast(x, DType::bf16);   // f32 -> bf16, round to nearest even; a new contiguous tensor
//   Tensor y = ops::upcast(h);              // bf16 -> f32 (exact); f32/f64 tensors are returned as they are
//
// 16-bit tensors are storage formats: kernels that accept them (matmul, attention, gelu, dropout, elementwise,
// reductions) convert their operands to f32 with upcast(), run the f32 kernel, and round the result back with
// cast(). Every conversion to f32 is exact, so a 16-bit op computes exactly what the f32 op computes on the same
// (rounded) values, plus one rounding of the result.
#pragma once

#include <functional>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// f16 or bf16.
inline bool is_half(DType dt) { return dt == DType::f16 || dt == DType::bf16; }

// t converted to dt as a new contiguous tensor (t itself when it already is contiguous and of dtype dt).
// Float <-> float conversions (f32, f64, f16, bf16); anything else goes through Tensor::copy_.
Tensor cast(const Tensor& t, DType dt);

// The CUDA kernels of cast_into (ops/cuda/tensor/cast.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<void(const Tensor&, Tensor&)> cast_into_device_kernel{"cast"};

// dst = src converted to dst's dtype; both contiguous with the same number of elements (float dtypes).
void cast_into(const Tensor& src, Tensor& dst);

// For 16-bit inputs of an op computed in f32: runs `f32_op` on blocks of rows of `x` (its first dimension, x
// contiguous) converted to f32, and writes each block's f32 result, rounded to x's dtype, into the same rows of the
// output (shape: x's rows, then `row_shape`). The f32 copies then never exceed one block (about 2 MiB) instead of
// the whole tensor: under mixed precision they are what sets the activation peak.
Tensor half_by_row_blocks(const Tensor& x, const Shape& row_shape, const std::function<Tensor(const Tensor&)>& f32_op);
// Rows per block for rows of `row_elems` elements.
int64_t half_block_rows(int64_t row_elems);

// The f32 copy of a 16-bit tensor; any other tensor is returned unchanged.
inline Tensor upcast(const Tensor& t) { return t.defined() && is_half(t.dtype()) ? cast(t, DType::f32) : t; }

}  // namespace minidl::ops
