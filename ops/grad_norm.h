// The global L2 norm of many gradients and the clip by it, kept where the gradients live: on a CUDA device the
// norm is one multi-tensor launch (and one to add its chunks) into a device scalar, and the clip coefficient is
// computed from that scalar by the clip kernel itself, so clipping needs no host round trip. optim/clip.h builds
// clip-by-global-norm on these; the CPU's own (bitwise reference) path is optim/clip.cpp.
//
//   Tensor sq = ops::grad_norm_squared_multi(grads, device);   // f32 {1} on `device`, summed in f64
//   /* combine sq over ranks: all_reduce(sq, kSum) */
//   ops::clip_grads_multi_(grads, sq, /*max_norm=*/1.0);        // g *= max / (sqrt(sq) + 1e-6) when that is < 1
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// grads: contiguous f32, all on `device`. Returns an f32 tensor of shape {1} on `device` holding the sum of the
// squares of every element (accumulated in f64 in a fixed order: the same bits on every run).
Tensor grad_norm_squared_multi(const std::vector<Tensor>& grads, Device device);
// norm_squared: an f32 {1} tensor on the gradients' device (grad_norm_squared_multi's, possibly combined over
// ranks). factor = max_norm / (sqrt(norm_squared) + 1e-6); every gradient is multiplied by float(factor) in place
// when factor < 1 (optim::clip_factor's rule; a NaN norm clips nothing).
void clip_grads_multi_(const std::vector<Tensor>& grads, const Tensor& norm_squared, double max_norm);

// The CUDA kernels (ops/cuda/tensor/device_step.cpp).
inline DeviceKernel<Tensor(const std::vector<Tensor>&, Device)> grad_norm_squared_multi_device{
    "grad_norm_squared_multi"};
inline DeviceKernel<void(const std::vector<Tensor>&, const Tensor&, double)> clip_grads_multi_device{
    "clip_grads_multi_"};

}  // namespace minidl::ops
