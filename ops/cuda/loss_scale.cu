// Dynamic loss scaling on the GPU with the scaler's state on the device (ops/cuda/loss_scale.h). The unscale is
// unscale.cu's pass (ops/cuda/unscale_grid.h) with the scale read from device memory; the update is
// GradScaler::update (optim/grad_scaler.cpp) rule for rule, in one thread.
#include "ops/cuda/loss_scale.h"

#include "ops/cuda/device_utils.h"
#include "ops/cuda/unscale_grid.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <int V>
__global__ void unscale_by_kernel(float* grad, int64_t n, const double* scale, int* found_inf) {
  unscale_grid<V>(grad, n, static_cast<float>(1.0 / *scale), found_inf);
}

__global__ void update_kernel(double* state, float* scale_f32, const int* found_inf, LossScaleRules r) {
  if (threadIdx.x != 0) return;
  double& scale = state[0];
  double& clean_steps = state[1];
  double& overflows_left = state[2];
  double& skipped_steps = state[3];
  if (*found_inf) {
    skipped_steps += 1;
    clean_steps = 0;
    overflows_left = overflows_left > 1 ? overflows_left - 1 : 0;
    if (overflows_left == 0) scale = scale * r.backoff_factor > r.min_scale ? scale * r.backoff_factor : r.min_scale;
  } else if ((clean_steps += 1) >= static_cast<double>(r.growth_interval)) {
    scale = scale * r.growth_factor < r.max_scale ? scale * r.growth_factor : r.max_scale;
    clean_steps = 0;
    overflows_left = static_cast<double>(r.hysteresis);
  }
  *scale_f32 = static_cast<float>(scale);
}

}  // namespace

cudaError_t unscale_and_check_by(float* grad, int64_t n, const double* scale, int* found_inf, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (aligned16(grad))
    return launch_kernel(unscale_by_kernel<4>, dim3(grid_stride_blocks(n / 4 + 1, kThreads)), dim3(kThreads), 0, stream,
                         grad, n, scale, found_inf);
  return launch_kernel(unscale_by_kernel<1>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream, grad, n,
                       scale, found_inf);
}

cudaError_t update_loss_scale(double* state, float* scale_f32, const int* found_inf, const LossScaleRules& rules,
                              cudaStream_t stream) {
  return launch_kernel(update_kernel, dim3(1), dim3(kWarpSize), 0, stream, state, scale_f32, found_inf, rules);
}

}  // namespace minidl::ops::cuda
