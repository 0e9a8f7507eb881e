// ops/linear_gelu.h on CUDA devices: one GEMM with the GELU (or linear's bias gradient) in its epilogue
// (ops/cuda/tensor/gemm.h). Returns std::nullopt where the backend has no algorithm for the shape; the op's entry
// then composes the unfused ops.
#include "ops/cuda/tensor/gemm.h"
#include "ops/cuda/tensor/register.h"
#include "ops/linear_gelu.h"

namespace minidl::ops::cuda {
namespace {

// x2: (rows, k), w: (k, n), bias: (n) or undefined.
std::optional<LinearGelu> linear_gelu(const Tensor& x2, const Tensor& w, const Tensor& bias) {
  const int64_t rows = x2.size(0), k = x2.size(1), n = w.size(1);
  OnDevice on(x2);
  LinearGelu f{Tensor::empty({rows, n}, x2.dtype(), x2.device()), Tensor::empty({rows, n}, x2.dtype(), x2.device())};
  if (!gemm_bias_gelu(x2.device().index, on.stream, x2.dtype(), rows, n, k, x2.raw_device_data(), w.raw_device_data(),
                      bias.defined() ? bias.raw_device_data() : nullptr, f.h.raw_device_data(),
                      f.aux.raw_device_data()))
    return std::nullopt;
  return f;
}

// dy2: (rows, k), w: (n, k), aux2: (rows, n).
std::optional<DgeluBgrad> dgelu_bgrad(const Tensor& dy2, const Tensor& w, const Tensor& aux2, bool bias_grad) {
  const int64_t rows = aux2.size(0), n = aux2.size(1), k = dy2.size(1);
  OnDevice on(aux2);
  DgeluBgrad g{Tensor::empty({rows, n}, aux2.dtype(), aux2.device()),
               bias_grad ? Tensor::empty({n}, aux2.dtype(), aux2.device()) : Tensor()};
  if (!gemm_dgelu_bgrad(aux2.device().index, on.stream, aux2.dtype(), rows, n, k, dy2.raw_device_data(),
                        w.raw_device_data(), aux2.raw_device_data(), g.dpre.raw_device_data(),
                        bias_grad ? g.dbias.raw_device_data() : nullptr))
    return std::nullopt;
  return g;
}

// x2: (rows, k), dy2: (rows, n); dw and dbias of x2's dtype, or f32 (f32_out).
std::optional<LinearGrad> linear_weight_bias_grad(const Tensor& x2, const Tensor& dy2, bool f32_out) {
  const int64_t rows = x2.size(0), k = x2.size(1), n = dy2.size(1);
  OnDevice on(x2);
  const DType out = f32_out ? DType::f32 : x2.dtype();
  LinearGrad g{Tensor::empty({k, n}, out, x2.device()), Tensor::empty({n}, out, x2.device())};
  if (!gemm_wgrad_bgrad(x2.device().index, on.stream, x2.dtype(), out, rows, k, n, x2.raw_device_data(),
                        dy2.raw_device_data(), g.dw.raw_device_data(), g.dbias.raw_device_data()))
    return std::nullopt;
  return g;
}

void register_linear_gelu() {
  linear_gelu_device.set(DeviceKind::kCUDA, &linear_gelu);
  dgelu_bgrad_device.set(DeviceKind::kCUDA, &dgelu_bgrad);
  linear_weight_bias_grad_device.set(DeviceKind::kCUDA, &linear_weight_bias_grad);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_linear_gelu);

}  // namespace minidl::ops::cuda
