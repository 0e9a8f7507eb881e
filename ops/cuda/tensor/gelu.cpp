// ops/gelu.h on CUDA devices. Plain GELU is an elementwise op (ops/cuda/elementwise.cu: f32, f16 and bf16 storage
// read and written directly); bias + GELU runs ops/cuda/bias_gelu.cu, f32, with 16-bit tensors converted to f32
// copies first and the results rounded back (dbias too), as the CPU op computes them.
#include "ops/cuda/tensor/elementwise.h"
#include "ops/cuda/bias_gelu.h"
#include "ops/cuda/tensor/register.h"
#include "ops/gelu.h"

namespace minidl::ops::cuda {
namespace {

Tensor gelu(const Tensor& x) { return unary_on_device("gelu", UnaryOp::kGelu, x, x.shape()); }
Tensor gelu_grad(const Tensor& dy, const Tensor& x) {
  return binary_on_device("gelu_backward", BinaryOp::kGeluBackward, dy, x);
}

Tensor f32_of(const Tensor& t) { return t.dtype() == DType::f32 ? t : upcast_on_device(t); }

Tensor bias_gelu(const Tensor& x, const Tensor& bias) {
  check_cuda_dtype("bias_gelu", x, /*half_too=*/true);
  if (x.dtype() != DType::f32) return downcast_on_device(bias_gelu(f32_of(x), f32_of(bias)), x.dtype());
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  MINIDL_CUDA_CHECK(bias_gelu_forward(x.device_data<float>(), bias.device_data<float>(), y.device_data<float>(),
                                      rows, int(C), on.stream));
  return y;
}

BiasGeluBackward bias_gelu_grad(const Tensor& dy, const Tensor& x, const Tensor& bias) {
  check_cuda_dtype("bias_gelu_backward", x, /*half_too=*/true);
  if (x.dtype() != DType::f32) {
    BiasGeluBackward g = bias_gelu_grad(f32_of(dy), f32_of(x), f32_of(bias));
    return {downcast_on_device(g.dx, x.dtype()), downcast_on_device(g.dbias, x.dtype())};
  }
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  BiasGeluBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device())};
  Tensor scratch =
      Tensor::empty({int64_t(bias_gelu_backward_scratch_floats(rows, int(C)))}, DType::f32, x.device());
  MINIDL_CUDA_CHECK(bias_gelu_backward(dy.device_data<float>(), x.device_data<float>(), bias.device_data<float>(),
                                       g.dx.device_data<float>(), g.dbias.device_data<float>(),
                                       scratch.device_data<float>(), rows, int(C), on.stream));
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
