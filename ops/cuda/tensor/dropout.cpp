// ops/dropout.h on CUDA devices: ops/cuda/dropout.cu through ops/cuda/dropout.h, f32 (16-bit inputs go through
// f32 in the op's entry, as on the CPU).
#include "ops/cuda/dropout.h"
#include "ops/cuda/tensor/register.h"
#include "ops/dropout.h"

namespace minidl::ops::cuda {
namespace {

Tensor dropout_fwd(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset) {
  check_f32("dropout", "x", x);
  OnDevice on(x);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  MINIDL_CUDA_CHECK(dropout(x.device_data<float>(), y.device_data<float>(), x.numel(), p, seed, stream, offset,
                            on.stream));
  return y;
}

void register_dropout() {
  dropout_device.set(DeviceKind::kCUDA, &dropout_fwd);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_dropout);

}  // namespace minidl::ops::cuda
