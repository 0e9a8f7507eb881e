// conv2d and max_pool2d on emulated CUDA devices (minidl_cuda_backend_emu only). cuDNN cannot run on the CPU, so
// the emulated backend stands in for it with the CPU kernels of ops/conv.h, run on the host memory behind the
// emulated device tensors (the emulator's device memory is host memory, and every stream is synchronous). The
// real backend calls cuDNN (conv_cudnn.cpp) with the same layouts, so this is the contract it is tested against.
#include "ops/conv.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

Tensor conv_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  check_f32("conv2d", "x", x);
  ConvGeometry g = check_conv2d("conv2d", x, weight, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.K}, x.dtype(), x.device());
  conv2d_forward_cpu(g, x.device_data<float>(), weight.device_data<float>(),
                     bias.defined() ? bias.device_data<float>() : nullptr, y.device_data<float>());
  return y;
}

Conv2dBackward conv_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dOptions& o,
                             bool need_dx) {
  check_f32("conv2d_backward", "x", x);
  ConvGeometry g = check_conv2d("conv2d_backward", x, weight, o);
  Conv2dBackward r{need_dx ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                   Tensor::empty(weight.shape(), x.dtype(), x.device()), Tensor::empty({g.K}, x.dtype(), x.device())};
  conv2d_backward_cpu(g, dy.device_data<float>(), x.device_data<float>(), weight.device_data<float>(),
                      need_dx ? r.dx.device_data<float>() : nullptr, r.dweight.device_data<float>(),
                      r.dbias.device_data<float>());
  return r;
}

Tensor pool_forward(const Tensor& x, const Pool2dOptions& o) {
  check_f32("max_pool2d", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d", x, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.C}, x.dtype(), x.device());
  max_pool2d_forward_cpu(g, x.device_data<float>(), y.device_data<float>());
  return y;
}

Tensor pool_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  check_f32("max_pool2d_backward", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d_backward", x, o);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  max_pool2d_backward_cpu(g, dy.device_data<float>(), x.device_data<float>(), y.device_data<float>(),
                          dx.device_data<float>());
  return dx;
}

void register_conv() {
  conv2d_forward_device.set(DeviceKind::kCUDA, &conv_forward);
  conv2d_backward_device.set(DeviceKind::kCUDA, &conv_backward);
  max_pool2d_forward_device.set(DeviceKind::kCUDA, &pool_forward);
  max_pool2d_backward_device.set(DeviceKind::kCUDA, &pool_backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_conv);

}  // namespace minidl::ops::cuda
