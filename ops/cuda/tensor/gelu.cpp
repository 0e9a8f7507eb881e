// ops/gelu.h on CUDA devices. Plain GELU is an elementwise op (ops/cuda/elementwise.cu); bias + GELU runs
// ops/cuda/bias_gelu.cu. Both read and write f32, f16 and bf16 storage directly (math in f32, no f32 copies).
#include "ops/cuda/bias_gelu.h"
#include "ops/cuda/tensor/dispatch_storage.h"
#include "ops/cuda/tensor/elementwise.h"
#include "ops/cuda/tensor/register.h"
#include "ops/gelu.h"

namespace minidl::ops::cuda {
namespace {

Tensor gelu(const Tensor& x) { return unary_on_device("gelu", UnaryOp::kGelu, x, x.shape()); }
Tensor gelu_grad(const Tensor& dy, const Tensor& x) {
  return binary_on_device("gelu_backward", BinaryOp::kGeluBackward, dy, x);
}

Tensor bias_gelu(const Tensor& x, const Tensor& bias) {
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float_storage("bias_gelu", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(bias_gelu_forward(storage_ptr<const T>(x), storage_ptr<const T>(bias), storage_ptr<T>(y), rows,
                                        int(C), on.stream));
  });
  return y;
}

BiasGeluBackward bias_gelu_grad(const Tensor& dy, const Tensor& x, const Tensor& bias) {
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  BiasGeluBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device())};
  Tensor scratch = Tensor::empty({int64_t(bias_gelu_backward_scratch_floats(rows, int(C)))}, DType::f32, x.device());
  dispatch_float_storage("bias_gelu_backward", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(bias_gelu_backward(storage_ptr<const T>(dy), storage_ptr<const T>(x), storage_ptr<const T>(bias),
                                         storage_ptr<T>(g.dx), storage_ptr<T>(g.dbias), scratch.device_data<float>(),
                                         rows, int(C), on.stream));
  });
  return g;
}

void register_gelu() {
  gelu_forward_device.set(DeviceKind::kCUDA, &gelu);
  gelu_backward_device.set(DeviceKind::kCUDA, &gelu_grad);
  bias_gelu_forward_device.set(DeviceKind::kCUDA, &bias_gelu);
  bias_gelu_backward_device.set(DeviceKind::kCUDA, &bias_gelu_grad);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_gelu);

}  // namespace minidl::ops::cuda
