// swiglu on CUDA devices: ops/cuda/swiglu.cu through ops/cuda/swiglu.h, f32, f16 and bf16 storage read and written
// directly (math in f32, no f32 copies).
#include "ops/cuda/swiglu.h"
#include "ops/cuda/tensor/dispatch_storage.h"
#include "ops/cuda/tensor/register.h"
#include "ops/swiglu.h"

namespace minidl::ops::cuda {
namespace {

Tensor forward(const Tensor& gate, const Tensor& up) {
  OnDevice on(gate);
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  dispatch_float_storage("swiglu", gate, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(swiglu_forward(storage_ptr<const T>(gate), storage_ptr<const T>(up), storage_ptr<T>(y),
                                     gate.numel(), on.stream));
  });
  return y;
}

SwiGLUBackward backward(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  OnDevice on(gate);
  SwiGLUBackward g{Tensor::empty(gate.shape(), gate.dtype(), gate.device()),
                   Tensor::empty(gate.shape(), gate.dtype(), gate.device())};
  dispatch_float_storage("swiglu_backward", gate, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(swiglu_backward(storage_ptr<const T>(dy), storage_ptr<const T>(gate), storage_ptr<const T>(up),
                                      storage_ptr<T>(g.dgate), storage_ptr<T>(g.dup), gate.numel(), on.stream));
  });
  return g;
}

void register_swiglu() {
  swiglu_forward_device.set(DeviceKind::kCUDA, &forward);
  swiglu_backward_device.set(DeviceKind::kCUDA, &backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_swiglu);

}  // namespace minidl::ops::cuda
