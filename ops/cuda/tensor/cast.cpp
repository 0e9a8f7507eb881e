// ops/cast.h's cast_into on CUDA devices: ops/cuda/cast.cu through ops/cuda/cast.h between f32 and f16/bf16; other
// pairs through core's converting copy.
#include "ops/cast.h"
#include "ops/cuda/cast.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

// Contiguous src and dst of the same element count.
bool cast_kernel(const Tensor& src, Tensor& dst) {
  OnDevice on(src);
  int64_t n = src.numel();
  DType from = src.dtype(), to = dst.dtype();
  if (from == DType::f32 && to == DType::f16)
    MINIDL_CUDA_CHECK(
        cast_f32_to_f16(src.device_data<float>(), reinterpret_cast<__half*>(dst.device_data<f16>()), n, on.stream));
  else if (from == DType::f32 && to == DType::bf16)
    MINIDL_CUDA_CHECK(cast_f32_to_bf16(src.device_data<float>(),
                                       reinterpret_cast<__nv_bfloat16*>(dst.device_data<bf16>()), n, on.stream));
  else if (from == DType::f16 && to == DType::f32)
    MINIDL_CUDA_CHECK(cast_f16_to_f32(reinterpret_cast<const __half*>(src.device_data<f16>()), dst.device_data<float>(),
                                      n, on.stream));
  else if (from == DType::bf16 && to == DType::f32)
    MINIDL_CUDA_CHECK(cast_bf16_to_f32(reinterpret_cast<const __nv_bfloat16*>(src.device_data<bf16>()),
                                       dst.device_data<float>(), n, on.stream));
  else
    return false;
  return true;
}

void cast_into_device(const Tensor& src, Tensor& dst) {
  if (!cast_kernel(src, dst)) dst.detach().view(src.shape()).copy_(src);  // other pairs: core's converting copy
}

void register_cast() { cast_into_device_kernel.set(DeviceKind::kCUDA, &cast_into_device); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_cast);

}  // namespace minidl::ops::cuda
