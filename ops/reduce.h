// Reductions (no autograd): sum, mean and max over all elements or over one dimension.
//
//   Tensor s = ops::sum(x, /*dim=*/0);                 // x: (N, C) -> (C), e.g. a bias gradient
//   auto [values, indices] = ops::max(logits, -1);     // (N, V) -> (N) values and (N) i64 argmax
//
// Inputs may have any strides; results are new contiguous tensors of the input's dtype (f32 or f64; sums also
// take f16/bf16, summed in f32 and rounded once).
// Full sums accumulate in double; sums over a dimension accumulate in the input's type.
// On CUDA devices: f32 (sums and means also f16/bf16), accumulated in f32 in an order fixed by the shape.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// Reductions over one dimension see x (contiguous) as (outer, n, inner) and produce (outer, inner).
struct DimLayout {
  int64_t outer = 1, n = 1, inner = 1;
};
inline DimLayout layout_of(const Shape& shape, int dim) {
  DimLayout l;
  for (int i = 0; i < dim; ++i) l.outer *= shape[i];
  l.n = shape[dim];
  for (int i = dim + 1; i < int(shape.size()); ++i) l.inner *= shape[i];
  return l;
}

// shape without dimension `dim` (already wrapped), or with it set to 1 when keepdim.
Shape reduced_shape(const Shape& shape, int dim, bool keepdim);

// All elements -> a scalar tensor (shape ()).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
Tensor max(const Tensor& x);  // x must not be empty; NaN propagates

// Over one dimension (negative counts from the back) -> reduced_shape(x.shape(), dim, keepdim).
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);

struct MaxResult {
  Tensor values;   // reduced shape, x's dtype
  Tensor indices;  // reduced shape, i64: position of the first maximum along dim
};
MaxResult max(const Tensor& x, int dim, bool keepdim = false);

// The gradient of max over `dim`: zeros of input_shape with grad placed at `indices` (both of the reduced shape,
// with or without the kept dimension). dim is wrapped against input_shape.
Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& input_shape, int dim);

// ---- the CUDA kernels (ops/cuda/tensor/reduce.cpp), filled by minidl::cuda::register_backend() ----
// Each entry above validates its arguments (and wraps dim), then hands device tensors to its table.
inline DeviceKernel<Tensor(const Tensor&)> sum_device{"sum"}, mean_device{"mean"}, max_device{"max"};
inline DeviceKernel<Tensor(const Tensor&, int, bool)> sum_dim_device{"sum"}, mean_dim_device{"mean"};
inline DeviceKernel<MaxResult(const Tensor&, int, bool)> max_dim_device{"max"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Shape&, int)> max_backward_device{"max_backward"};

}  // namespace minidl::ops
