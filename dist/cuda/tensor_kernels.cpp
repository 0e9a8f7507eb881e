#include "dist/cuda/tensor_kernels.h"

#include "core/cuda/cuda.h"
#include "dist/reduce.h"
#include "ops/cuda/cast.h"

namespace minidl::dist {

cuda_kernels::ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return cuda_kernels::ElementType::kF32;
    case DType::f64: return cuda_kernels::ElementType::kF64;
    case DType::i32: return cuda_kernels::ElementType::kI32;
    case DType::i64: return cuda_kernels::ElementType::kI64;
    case DType::u8: return cuda_kernels::ElementType::kU8;
    case DType::f16:
    case DType::bf16: break;
  }
  MINIDL_ASSERT(false, "dist device kernels: ", dtype, " reductions must be staged through f32 by ProcessGroup");
}

namespace {

void reduce_into_cuda(Tensor& dst, const Tensor& src, ReduceOp op) {
  const int device = dst.device().index;
  cuda::DeviceGuard guard(device);
  const auto combine = op == ReduceOp::kMax ? cuda_kernels::Combine::kMax : cuda_kernels::Combine::kSum;
  MINIDL_CUDA_CHECK(cuda_kernels::combine_into(element_type(dst.dtype()), combine, dst.raw_device_data(),
                                               src.raw_device_data(), dst.numel(), cuda::current_stream(device)));
}

void divide_by_cuda(Tensor& data, int divisor) {
  const int device = data.device().index;
  cuda::DeviceGuard guard(device);
  MINIDL_CUDA_CHECK(cuda_kernels::divide_by(element_type(data.dtype()), data.raw_device_data(), data.numel(), divisor,
                                            cuda::current_stream(device)));
}

// The f32 staging of f16/bf16 collectives, with ops/cuda's cast kernels (round to nearest even, as on the CPU).
void convert_into_cuda(Tensor& dst, const Tensor& src) {
  const int device = dst.device().index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  const int64_t n = dst.numel();
  void* out = dst.raw_device_data();
  const void* in = src.raw_device_data();
  if (src.dtype() == DType::f16 && dst.dtype() == DType::f32)
    MINIDL_CUDA_CHECK(ops::cuda::cast_f16_to_f32(static_cast<const __half*>(in), static_cast<float*>(out), n, stream));
  else if (src.dtype() == DType::bf16 && dst.dtype() == DType::f32)
    MINIDL_CUDA_CHECK(
        ops::cuda::cast_bf16_to_f32(static_cast<const __nv_bfloat16*>(in), static_cast<float*>(out), n, stream));
  else if (src.dtype() == DType::f32 && dst.dtype() == DType::f16)
    MINIDL_CUDA_CHECK(ops::cuda::cast_f32_to_f16(static_cast<const float*>(in), static_cast<__half*>(out), n, stream));
  else if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16)
    MINIDL_CUDA_CHECK(
        ops::cuda::cast_f32_to_bf16(static_cast<const float*>(in), static_cast<__nv_bfloat16*>(out), n, stream));
  else
    MINIDL_CHECK(false, "dist::convert_into on ", dst.device(), ": no kernel from ", src.dtype(), " to ", dst.dtype(),
                 " (f32 <-> f16/bf16 only)");
}

}  // namespace

void register_tensor_kernels() {
  reduce_into_device.set(DeviceKind::kCUDA, &reduce_into_cuda);
  divide_by_device.set(DeviceKind::kCUDA, &divide_by_cuda);
  convert_into_device.set(DeviceKind::kCUDA, &convert_into_cuda);
}

}  // namespace minidl::dist
