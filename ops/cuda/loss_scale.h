// Launchers of ops/cuda/loss_scale.cu: dynamic loss scaling with its state on the device, so an fp16 step neither
// reads the overflow flag nor sends the scale (ops/unscale.h is the op on Tensors, optim/grad_scaler.h the rules).
//
//   double* state;  // {scale, clean_steps, overflows_left, skipped_steps}, on the device
//   CUDA_CHECK(unscale_and_check_by(grad, n, state, found_inf, stream));   // grad *= float(1 / state[0])
//   CUDA_CHECK(update_loss_scale(state, scale_f32, found_inf, rules, stream));
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// GradScaler's options (optim/grad_scaler.h), by value.
struct LossScaleRules {
  double growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval, hysteresis;
};

// grad (n floats) *= float(1.0 / *scale) in place (the host's inv_scale, computed on the device); sets *found_inf
// to 1 if any result is inf or NaN and leaves it alone otherwise (unscale_and_check's contract).
cudaError_t unscale_and_check_by(float* grad, int64_t n, const double* scale, int* found_inf, cudaStream_t stream);
// One thread applies GradScaler's update rules to state = {scale, clean_steps, overflows_left, skipped_steps}
// given *found_inf, and writes the new scale as f32 to *scale_f32 (what the next loss is multiplied by).
cudaError_t update_loss_scale(double* state, float* scale_f32, const int* found_inf, const LossScaleRules& rules,
                              cudaStream_t stream);

}  // namespace minidl::ops::cuda
