// ops/dropout.h on CUDA devices: ops/cuda/dropout.cu through ops/cuda/dropout.h, f32 (16-bit inputs go through
// f32 in the op's entry, as on the CPU). A DropoutStep's tensor is read by the kernel, never copied to the host.
#include "ops/cuda/dropout.h"
#include "ops/cuda/tensor/register.h"
#include "ops/dropout.h"

namespace minidl::ops::cuda {
namespace {

Tensor dropout_fwd(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset,
                   const DropoutStep& step) {
  check_f32("dropout", "x", x);
  OnDevice on(x);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  const int64_t* step_on_device = step.step.defined() ? step.step.device_data<int64_t>() : nullptr;
  MINIDL_CUDA_CHECK(dropout(x.device_data<float>(), y.device_data<float>(), x.numel(), p, seed, stream, offset,
                            step_on_device, step.offset_per_step, on.stream));
  return y;
}

void register_dropout() { dropout_device.set(DeviceKind::kCUDA, &dropout_fwd); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_dropout);

}  // namespace minidl::ops::cuda
