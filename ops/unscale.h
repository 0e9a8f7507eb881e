// Fused unscale-and-check for dynamic loss scaling (optim/grad_scaler.h): one pass over a gradient multiplies it
// by 1/scale in place and detects inf/NaN in the same loop, instead of a pass to unscale and another to check.
//
//   bool overflow = false;
//   for (Tensor& g : grads) overflow |= ops::unscale_and_check_(g, 1.0f / scale);
//
// With a power-of-two scale (what GradScaler uses) the multiply is exact: the result equals grad / scale bit for
// bit. The math per element is ops/kernels/unscale.h.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// grad: contiguous f32. Multiplies every element by inv_scale in place; returns true if any result is inf or
// NaN (all elements are still multiplied).
// The CUDA kernel (ops/cuda/tensor/nn.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<bool(const Tensor&, float)> unscale_and_check_device{"unscale_and_check_"};

bool unscale_and_check_(const Tensor& grad, float inv_scale);

}  // namespace minidl::ops
