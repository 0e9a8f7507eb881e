// rope on CUDA devices: ops/cuda/rope.cu through ops/cuda/rope.h. x in f32, f16 or bf16 storage, read and written
// directly; the tables f32. f64 stays a CPU dtype (gradient checks).
#include "ops/cuda/rope.h"
#include "ops/cuda/tensor/dispatch_storage.h"
#include "ops/cuda/tensor/register.h"
#include "ops/rope.h"

namespace minidl::ops::cuda {
namespace {

Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset, bool inverse) {
  OnDevice on(x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float_storage("rope", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(rope(storage_ptr<const T>(x), cos.device_data<float>(), sin.device_data<float>(),
                           storage_ptr<T>(y), x.size(0), x.size(1), x.size(2), int(x.size(3) / 2), position_offset,
                           inverse, on.stream));
  });
  return y;
}

void register_rope() { rope_device.set(DeviceKind::kCUDA, &rotate); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_rope);

}  // namespace minidl::ops::cuda
