// conv2d and max_pool2d on emulated CUDA devices (minidl_cuda_backend_emu only). cuDNN cannot run on the CPU, so
// the emulated backend stands in for it with the CPU kernels of ops/conv.h, run on the host memory behind the
// emulated device tensors (the emulator's device memory is host memory), queued on the device's compute stream as
// cuDNN's kernels would be (cuda_emu/graph.h: enqueue; with deferred streams they run in stream order). The real
// backend calls cuDNN (conv_cudnn.cpp) with the same layouts, so this is the contract it is tested against.
#include "core/cuda/cuda.h"
#include "cuda_emu/graph.h"
#include "ops/conv.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

// Queues `work` on the compute stream of `device`'s tensors. The pointers it captures stay valid: a freed block
// goes back to the caching allocator for this stream only, so whatever reuses it is queued after `work`.
template <class Work>
void on_compute_stream(Device device, Work work) {
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(minidl::cuda::current_stream(device.index), [work] {
    work();
    return cudaSuccess;
  }));
}

Tensor conv_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  check_f32("conv2d", "x", x);
  ConvGeometry g = check_conv2d("conv2d", x, weight, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.K}, x.dtype(), x.device());
  on_compute_stream(x.device(), [g, px = x.device_data<float>(), pw = weight.device_data<float>(),
                                 pb = bias.defined() ? bias.device_data<float>() : nullptr,
                                 py = y.device_data<float>()] { conv2d_forward_cpu(g, px, pw, pb, py); });
  return y;
}

Conv2dBackward conv_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dOptions& o,
                             bool need_dx) {
  check_f32("conv2d_backward", "x", x);
  ConvGeometry g = check_conv2d("conv2d_backward", x, weight, o);
  Conv2dBackward r{need_dx ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                   Tensor::empty(weight.shape(), x.dtype(), x.device()), Tensor::empty({g.K}, x.dtype(), x.device())};
  on_compute_stream(x.device(),
                    [g, pdy = dy.device_data<float>(), px = x.device_data<float>(), pw = weight.device_data<float>(),
                     pdx = need_dx ? r.dx.device_data<float>() : nullptr, pdw = r.dweight.device_data<float>(),
                     pdb = r.dbias.device_data<float>()] { conv2d_backward_cpu(g, pdy, px, pw, pdx, pdw, pdb); });
  return r;
}

Tensor pool_forward(const Tensor& x, const Pool2dOptions& o) {
  check_f32("max_pool2d", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d", x, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.C}, x.dtype(), x.device());
  on_compute_stream(
      x.device(), [g, px = x.device_data<float>(), py = y.device_data<float>()] { max_pool2d_forward_cpu(g, px, py); });
  return y;
}

Tensor pool_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  check_f32("max_pool2d_backward", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d_backward", x, o);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  on_compute_stream(x.device(),
                    [g, pdy = dy.device_data<float>(), px = x.device_data<float>(), py = y.device_data<float>(),
                     pdx = dx.device_data<float>()] { max_pool2d_backward_cpu(g, pdy, px, py, pdx); });
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
