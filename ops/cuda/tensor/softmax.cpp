// ops/softmax.h on CUDA devices: ops/cuda/softmax.cu through ops/cuda/softmax.h. f32 only (f64 stays a CPU dtype
// for gradient checks).
#include "ops/cuda/tensor/elementwise.h"
#include "ops/cuda/softmax.h"
#include "ops/cuda/tensor/register.h"
#include "ops/softmax.h"

namespace minidl::ops::cuda {
namespace {

Tensor forward(const Tensor& x) {
  check_cuda_dtype("softmax", x, /*half_too=*/false);
  OnDevice on(x);
  const int64_t V = x.size(-1), rows = x.numel() / V;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  MINIDL_CUDA_CHECK(softmax_forward(x.device_data<float>(), y.device_data<float>(), rows, V, on.stream));
  return y;
}

Tensor backward(const Tensor& dy, const Tensor& y) {
  check_cuda_dtype("softmax_backward", y, /*half_too=*/false);
  OnDevice on(y);
  const int64_t V = y.size(-1), rows = y.numel() / V;
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  MINIDL_CUDA_CHECK(
      softmax_backward(dy.device_data<float>(), y.device_data<float>(), dx.device_data<float>(), rows, V, on.stream));
  return dx;
}

void register_softmax() {
  softmax_forward_device.set(DeviceKind::kCUDA, &forward);
  softmax_backward_device.set(DeviceKind::kCUDA, &backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_softmax);

}  // namespace minidl::ops::cuda
