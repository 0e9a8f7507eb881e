// Fused unscale-and-check-for-inf on the GPU (ops/unscale.h; CPU reference ops/cpu/unscale.cpp): one pass
// multiplies a gradient by 1/scale in place and raises a device flag if any result is inf or NaN. The
// per-element math is kernels::unscale_element, the function the CPU loop calls.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/unscale.h"
#include "ops/cuda/unscale_grid.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// ops/cuda/unscale_grid.h's pass. No __launch_bounds__: with it, ptxas for sm_90 holds the V = 4 kernel to 32
// registers and spills 4 bytes (bench/cuda_resources.sh); without, it takes 34 and none.
template <int V>
__global__ void unscale_kernel(float* grad, int64_t n, float inv_scale, int* found_inf) {
  unscale_grid<V>(grad, n, inv_scale, found_inf);
}

}  // namespace

cudaError_t unscale_and_check(float* grad, int64_t n, float inv_scale, int* found_inf, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (aligned16(grad))
    return launch_kernel(unscale_kernel<4>, dim3(grid_stride_blocks(n / 4 + 1, kThreads)), dim3(kThreads), 0, stream,
                         grad, n, inv_scale, found_inf);
  return launch_kernel(unscale_kernel<1>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream, grad, n,
                       inv_scale, found_inf);
}

}  // namespace minidl::ops::cuda
