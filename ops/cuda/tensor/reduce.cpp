// ops/reduce.h on CUDA devices: ops/cuda/reduce.cu through ops/cuda/reduce.h. f32; sums and means also take
// f16/bf16 (summed in f32, rounded once, as on the CPU); f64 stays a CPU dtype. Strided views are made contiguous
// first, on the device.
#include "ops/cuda/tensor/elementwise.h"
#include "ops/cuda/reduce.h"
#include "ops/cuda/tensor/register.h"
#include "ops/reduce.h"

namespace minidl::ops::cuda {
namespace {

Tensor scratch_floats(size_t n, Device device) { return Tensor::empty({int64_t(n)}, DType::f32, device); }

// x (f32, contiguous) reduced over everything into a scalar tensor.
Tensor reduce_all_f32(ReduceOp op, const Tensor& x, float scale) {
  OnDevice on(x);
  Tensor out = Tensor::empty(Shape{}, DType::f32, x.device());
  Tensor scratch = scratch_floats(reduce_all_scratch_floats(x.numel()), x.device());
  MINIDL_CUDA_CHECK(reduce_all(op, x.device_data<float>(), x.numel(), scale, out.device_data<float>(),
                               scratch.device_data<float>(), on.stream));
  return out;
}

// The sum of everything times `scale`, for f32 and (through an f32 copy) f16/bf16.
Tensor sum_scaled(const char* op, const Tensor& x, double scale) {
  check_cuda_dtype(op, x, /*half_too=*/true);
  if (x.dtype() != DType::f32)
    return downcast_on_device(reduce_all_f32(ReduceOp::kSum, upcast_on_device(x), float(scale)), x.dtype());
  return reduce_all_f32(ReduceOp::kSum, contiguous_on_device(x), float(scale));
}

Tensor sum_all(const Tensor& x) { return sum_scaled("sum", x, 1.0); }
Tensor mean_all(const Tensor& x) { return sum_scaled("mean", x, 1.0 / double(x.numel())); }

Tensor max_all(const Tensor& x) {
  check_cuda_dtype("max", x, /*half_too=*/false);
  return reduce_all_f32(ReduceOp::kMax, contiguous_on_device(x), 1.0f);
}

Tensor sum_dim_scaled(const char* op, const Tensor& x, int dim, bool keepdim, bool mean) {
  check_cuda_dtype(op, x, /*half_too=*/true);
  if (x.dtype() != DType::f32)
    return downcast_on_device(sum_dim_scaled(op, upcast_on_device(x), dim, keepdim, mean), x.dtype());
  const DimLayout l = layout_of(x.shape(), dim);
  Tensor out = Tensor::empty(reduced_shape(x.shape(), dim, keepdim), DType::f32, x.device());
  if (l.n == 0) return Tensor::zeros(out.shape(), DType::f32, x.device());
  Tensor xc = contiguous_on_device(x);
  OnDevice on(x);
  Tensor scratch = scratch_floats(reduce_dim_scratch_floats(ReduceOp::kSum, l.outer, l.n, l.inner), x.device());
  const float scale = mean ? float(1.0 / double(l.n)) : 1.0f;
  MINIDL_CUDA_CHECK(reduce_dim(ReduceOp::kSum, xc.device_data<float>(), l.outer, l.n, l.inner, scale,
                               out.device_data<float>(), nullptr, scratch.device_data<float>(), on.stream));
  return out;
}

Tensor sum_dim(const Tensor& x, int dim, bool keepdim) { return sum_dim_scaled("sum", x, dim, keepdim, false); }
Tensor mean_dim(const Tensor& x, int dim, bool keepdim) { return sum_dim_scaled("mean", x, dim, keepdim, true); }

MaxResult max_dim(const Tensor& x, int dim, bool keepdim) {
  check_cuda_dtype("max", x, /*half_too=*/false);
  const DimLayout l = layout_of(x.shape(), dim);
  const Shape shape = reduced_shape(x.shape(), dim, keepdim);
  MaxResult r{Tensor::empty(shape, DType::f32, x.device()), Tensor::empty(shape, DType::i64, x.device())};
  Tensor xc = contiguous_on_device(x);
  OnDevice on(x);
  Tensor scratch = scratch_floats(reduce_dim_scratch_floats(ReduceOp::kMax, l.outer, l.n, l.inner), x.device());
  MINIDL_CUDA_CHECK(reduce_dim(ReduceOp::kMax, xc.device_data<float>(), l.outer, l.n, l.inner, 1.0f,
                               r.values.device_data<float>(), r.indices.device_data<int64_t>(),
                               scratch.device_data<float>(), on.stream));
  return r;
}

Tensor max_backward_dim(const Tensor& grad, const Tensor& indices, const Shape& input_shape, int dim) {
  check_cuda_dtype("max_backward", grad, /*half_too=*/false);
  const DimLayout l = layout_of(input_shape, dim);
  Tensor dx = Tensor::empty(input_shape, DType::f32, grad.device());
  Tensor g = contiguous_on_device(grad), idx = contiguous_on_device(indices);
  OnDevice on(grad);
  MINIDL_CUDA_CHECK(max_backward(g.device_data<float>(), idx.device_data<int64_t>(), dx.device_data<float>(), l.outer,
                                 l.n, l.inner, on.stream));
  return dx;
}

void register_reduce() {
  sum_device.set(DeviceKind::kCUDA, &sum_all);
  mean_device.set(DeviceKind::kCUDA, &mean_all);
  max_device.set(DeviceKind::kCUDA, &max_all);
  sum_dim_device.set(DeviceKind::kCUDA, &sum_dim);
  mean_dim_device.set(DeviceKind::kCUDA, &mean_dim);
  max_dim_device.set(DeviceKind::kCUDA, &max_dim);
  max_backward_device.set(DeviceKind::kCUDA, &max_backward_dim);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_reduce);

}  // namespace minidl::ops::cuda
