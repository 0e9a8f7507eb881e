// Inverted dropout with a counter-based mask, without autograd.
//
//   Tensor y = ops::dropout(x, 0.1, seed, stream, offset);
//   Tensor dx = ops::dropout(dy, 0.1, seed, stream, offset);   // backward: the same call on the gradient
//
// The mask is a pure function of (seed, stream, offset, element index): see ops/kernels/dropout.h for the exact
// mapping, which the CUDA kernel reproduces bit for bit. Backward recomputes the mask instead of storing it:
// a Philox draw covers eight elements and costs less than reading a stored byte mask back from memory, it saves a
// u8 tensor the size of every dropped activation, and activation checkpointing replays it for free.
//
// Under a CUDA graph the offset cannot be a kernel argument (a replay repeats the captured arguments), so the
// offset may also take a step that the kernel reads from device memory when it runs:
//
//   Tensor step = Tensor::zeros({1}, DType::i64, device);             // the caller keeps it current (fill_)
//   Tensor y = ops::dropout(x, 0.1, seed, stream, offset, {step, 1ull << 40});   // counter offset + step * 2^40
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// A step read where the tensors live when the op runs: the draws start at offset + step * offset_per_step
// (unsigned, wrapping like the host's arithmetic), so the mask is the one of the plain call with that offset.
struct DropoutStep {
  Tensor step;  // i64 {1} on x's device; undefined: no step (offset alone)
  uint64_t offset_per_step = 0;
};

// x: any shape, f32/f64 or f16/bf16 (same mask; computed in f32); 0 <= p < 1 -> x * keep / (1 - p), like x.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset);
// The same with the step read on x's device (a CUDA graph's replay reads the step's current value).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset, const DropoutStep& step);

// ---- argument checks, shared by every backend's entry ----
// The CUDA kernel (ops/cuda/tensor/dropout.cpp; f32, the CPU's mask bit for bit), filled by
// minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&, double, uint64_t, uint64_t, uint64_t, const DropoutStep&)> dropout_device{
    "dropout"};

inline void check_dropout(const Tensor& x, double p, const DropoutStep& step = {}) {
  check_float_or_half("dropout", "x", x);
  MINIDL_CHECK(p >= 0.0 && p < 1.0, "dropout: expected a probability p in [0, 1), got ", p);
  if (!step.step.defined()) return;
  MINIDL_CHECK(step.step.dtype() == DType::i64 && step.step.numel() == 1,
               "dropout: expected the step as one i64, "
               "got ",
               step.step.dtype(), " ", step.step.shape());
  MINIDL_CHECK(step.step.device() == x.device(), "dropout: expected the step on x's device ", x.device(), ", got ",
               step.step.device());
}

}  // namespace minidl::ops
