// Fused unscale-and-check for dynamic loss scaling (optim/grad_scaler.h): one pass over a gradient multiplies it
// by 1/scale in place and detects inf/NaN in the same loop, instead of a pass to unscale and another to check.
//
//   bool overflow = false;
//   for (Tensor& g : grads) overflow |= ops::unscale_and_check_(g, 1.0f / scale);
//
// With a power-of-two scale (what GradScaler uses) the multiply is exact: the result equals grad / scale bit for
// bit. The math per element is ops/kernels/unscale.h.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// grad: contiguous f32. Multiplies every element by inv_scale in place; returns true if any result is inf or
// NaN (all elements are still multiplied).
// The same for every gradient of a list (all on one device): true if any had an inf or NaN. On a CUDA device one
// flag on the device collects them all and is read back once.
bool unscale_and_check_multi_(const std::vector<Tensor>& grads, float inv_scale);

// The CUDA kernels (ops/cuda/tensor/unscale.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<bool(const Tensor&, float)> unscale_and_check_device{"unscale_and_check_"};
inline DeviceKernel<bool(const std::vector<Tensor>&, float)> unscale_and_check_multi_device{"unscale_and_check_multi_"};

bool unscale_and_check_(const Tensor& grad, float inv_scale);

}  // namespace minidl::ops
