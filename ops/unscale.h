// Fused unscale-and-check for dynamic loss scaling (optim/grad_scaler.h): one pass over a gradient multiplies it
// by 1/scale in place and detects inf/NaN in the same loop, instead of a pass to unscale and another to check.
//
//   bool overflow = false;
//   for (Tensor& g : grads) overflow |= ops::unscale_and_check_(g, 1.0f / scale);
//
// With a power-of-two scale (what GradScaler uses) the multiply is exact: the result equals grad / scale bit for
// bit. The math per element is ops/kernels/unscale.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// grad: contiguous f32. Multiplies every element by inv_scale in place; returns true if any result is inf or
// NaN (all elements are still multiplied).
// The same for every gradient of a list (all on one device): true if any had an inf or NaN. On a CUDA device one
// flag on the device collects them all and is read back once.
bool unscale_and_check_multi_(const std::vector<Tensor>& grads, float inv_scale);

// Loss scaling with the scaler's state kept where the gradients are (optim::GradScaler on a CUDA device: nothing is
// read back). `state` is an f64 tensor {scale, clean_steps, overflows_left, skipped_steps}; found_inf an i32 {1}
// flag, zeroed by the caller.
// Every gradient *= float(1 / state[0]) in place; found_inf is set to 1 if any result is inf or NaN.
void unscale_and_check_by_(const std::vector<Tensor>& grads, const Tensor& state, const Tensor& found_inf);
// GradScaler's update rules (optim/grad_scaler.h), applied to `state` given found_inf; scale_f32 (f32 {1}) receives
// the new scale, what the next loss is multiplied by.
struct LossScaleRules {
  double growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval, hysteresis;
};
void update_loss_scale_(const Tensor& state, const Tensor& scale_f32, const Tensor& found_inf,
                        const LossScaleRules& rules);

// The CUDA kernels (ops/cuda/tensor/unscale.cpp and, for the state on the device, ops/cuda/tensor/device_step.cpp),
// filled by minidl::cuda::register_backend().
inline DeviceKernel<void(const std::vector<Tensor>&, const Tensor&, const Tensor&)> unscale_and_check_by_device{
    "unscale_and_check_by_"};
inline DeviceKernel<void(const Tensor&, const Tensor&, const Tensor&, const LossScaleRules&)> update_loss_scale_device{
    "update_loss_scale_"};
inline DeviceKernel<bool(const Tensor&, float)> unscale_and_check_device{"unscale_and_check_"};
inline DeviceKernel<bool(const std::vector<Tensor>&, float)> unscale_and_check_multi_device{"unscale_and_check_multi_"};

bool unscale_and_check_(const Tensor& grad, float inv_scale);

}  // namespace minidl::ops
