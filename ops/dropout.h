// Inverted dropout with a counter-based mask, without autograd.
//
//   Tensor y = ops::dropout(x, 0.1, seed, stream, offset);
//   Tensor dx = ops::dropout(dy, 0.1, seed, stream, offset);   // backward: the same call on the gradient
//
// The mask is a pure function of (seed, stream, offset, element index): see ops/kernels/dropout.h for the exact
// mapping, which the CUDA kernel reproduces bit for bit. Backward recomputes the mask instead of storing it:
// a Philox draw covers four elements and costs less than reading a stored byte mask back from memory, it saves a
// u8 tensor the size of every dropped activation, and activation checkpointing replays it for free.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// x: any shape, f32/f64 or f16/bf16 (same mask; computed in f32); 0 <= p < 1 -> x * keep / (1 - p), like x.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset);

// ---- argument checks, shared by every backend's entry ----
// The CUDA kernel (ops/cuda/tensor/dropout.cpp; f32, the CPU's mask bit for bit), filled by
// minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&, double, uint64_t, uint64_t, uint64_t)> dropout_device{"dropout"};

inline void check_dropout(const Tensor& x, double p) {
  check_float_or_half("dropout", "x", x);
  MINIDL_CHECK(p >= 0.0 && p < 1.0, "dropout: expected a probability p in [0, 1), got ", p);
}

}  // namespace minidl::ops
