// SwiGLU, Llama's MLP activation, without autograd: out = silu(gate) * up, silu(g) = g * sigmoid(g). The MLP's
// two projections (gate_proj, up_proj) are separate matmuls outside the op; the per-element math is
// ops/kernels/swiglu.h.
//
//   Tensor h = ops::swiglu_forward(gate, up);              // gate, up: any shape, the same
//   auto [dgate, dup] = ops::swiglu_backward(dh, gate, up);
//
// With s = sigmoid(g):  dgate = dy * up * s * (1 + g (1 - s)),  dup = dy * g * s.
// 16-bit inputs are computed in f32, each result rounded once to their dtype.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// gate, up: the same shape and dtype (f32, f64, or f16/bf16 storage), contiguous -> like gate.
Tensor swiglu_forward(const Tensor& gate, const Tensor& up);

struct SwiGLUBackward {
  Tensor dgate;  // like gate
  Tensor dup;    // like up
};
// dy: like gate.
SwiGLUBackward swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up);

// The CUDA kernels (ops/cuda/tensor/swiglu.cpp: f32, f16 and bf16 storage read directly, math in f32), filled by
// minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> swiglu_forward_device{"swiglu"};
inline DeviceKernel<SwiGLUBackward(const Tensor&, const Tensor&, const Tensor&)> swiglu_backward_device{
    "swiglu_backward"};

// ---- argument checks, shared by every backend's entry ----
inline void check_swiglu(const char* op, const Tensor& gate, const Tensor& up) {
  check_float_or_half(op, "gate", gate);
  check_shaped_like(op, "up", up, gate.shape(), gate);
}

}  // namespace minidl::ops
