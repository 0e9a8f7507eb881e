// The GPT MLP's first half and the backward that meets it: a linear layer followed by GELU (tanh, as GPT-2), with
// the GELU input kept for backward, and the GELU's input gradient computed from the next linear layer's output
// gradient. On a CUDA device each is one GEMM with the GELU in its epilogue (cuBLASLt's GELU_AUX_BIAS and
// DGELU_BGRAD; ops/cuda/tensor/gemm.h), where the backend has an algorithm for the shape; elsewhere, and as the
// fallback, the same composition of ops::linear, ops::gelu_forward, ops::matmul and ops::bias_gelu_backward
// (ops::gelu_backward without a bias gradient).
//
//   ops::LinearGelu f = ops::linear_gelu_forward(x, c_fc_w, c_fc_b);   // f.h = gelu(x W + b), f.aux = x W + b
//   Tensor y = ops::linear(f.h, c_proj_w, c_proj_b);
//   ops::DgeluBgrad g = ops::dgelu_bgrad(dy, c_proj_w, f.aux, true);   // g.dpre = (dy W_proj^T) gelu'(aux)
#pragma once

#include <optional>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

struct LinearGelu {
  Tensor h;    // (..., n): gelu(aux)
  Tensor aux;  // (..., n): x w + bias, the GELU input
};
// x: (..., k), f32/f64 or f16/bf16; w: (k, n) and bias: (n) or undefined, both of x's dtype and device.
LinearGelu linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias);

struct DgeluBgrad {
  Tensor dpre;   // (..., n): (dy w^T) * gelu'(aux)
  Tensor dbias;  // (n): dpre summed over rows (f32 accumulation, fixed order), or undefined without bias_grad
};
// dy: (..., k); w: (n, k) (the weight of the linear layer that follows the GELU); aux: (..., n), as returned by
// linear_gelu_forward; all one dtype and device.
DgeluBgrad dgelu_bgrad(const Tensor& dy, const Tensor& w, const Tensor& aux, bool bias_grad);

// linear's weight and bias gradients from its input rows x2 (rows, k) and output gradient dy2 (rows, n), one dtype
// and device: dw (k, n) = x2^T dy2 and dbias (n) = dy2 summed over rows (f32 accumulation, fixed order). f32_out:
// 16-bit x2 and dy2 give an f32 dw and dbias, never rounded to 16 bits (mixed precision's gradients of f32
// weights; ops::matmul_f32). On a CUDA device one GEMM with the bias gradient in its epilogue (cuBLASLt's BGRADA)
// where the backend has an algorithm for the shape; on the CPU in f32, ops::linear_weight_bias_grad_into (the sums
// in the product's parallel region, ops::sum's bits); elsewhere, and as the fallback, ops::matmul (or matmul_f32)
// and ops::sum, whose order the emulator's epilogue reproduces (same bits).
struct LinearGrad {
  Tensor dw;     // (k, n)
  Tensor dbias;  // (n)
};
LinearGrad linear_weight_bias_grad(const Tensor& x2, const Tensor& dy2, bool f32_out);

// Whether a CUDA device may use the fused epilogues (default true). false forces the unfused composition: a test
// hook that exercises the fallback cuBLASLt takes for shapes it has no algorithm for.
void set_gemm_epilogues_enabled(bool enabled);
bool gemm_epilogues_enabled();

// The CUDA kernels (ops/cuda/tensor/linear_gelu.cpp), on validated contiguous 2-D rows: x2 (rows, k), dy2 (rows, k),
// aux2 (rows, n). They return std::nullopt (nothing done) where the backend has no fused algorithm for the shape.
inline DeviceKernel<std::optional<LinearGelu>(const Tensor&, const Tensor&, const Tensor&)> linear_gelu_device{
    "linear_gelu"};
inline DeviceKernel<std::optional<DgeluBgrad>(const Tensor&, const Tensor&, const Tensor&, bool)> dgelu_bgrad_device{
    "dgelu_bgrad"};
// x2 (rows, k), dy2 (rows, n), contiguous and validated; std::nullopt where no fused algorithm exists.
inline DeviceKernel<std::optional<LinearGrad>(const Tensor&, const Tensor&, bool)> linear_weight_bias_grad_device{
    "linear_weight_bias_grad"};

}  // namespace minidl::ops
