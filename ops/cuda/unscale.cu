// Fused unscale-and-check-for-inf on the GPU (ops/unscale.h; CPU reference ops/cpu/unscale.cpp): one pass
// multiplies a gradient by 1/scale in place and raises a device flag if any result is inf or NaN. The
// per-element math is kernels::unscale_element, the function the CPU loop calls.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/unscale.h"
#include "ops/kernels/unscale.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride over groups of V floats (V = 4: 128-bit accesses), then the last n % V elements one at a time.
// Each thread ORs its own flags; one vote per warp and one atomic per warp that saw a bad value keep the flag's
// atomics off the common (all finite) path entirely. No __launch_bounds__: with it, ptxas for sm_90 holds the
// V = 4 kernel to 32 registers and spills 4 bytes (bench/cuda_resources.sh); without, it takes 34 and none.
template <int V>
__global__ void unscale_kernel(float* grad, int64_t n, float inv_scale, int* found_inf) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = n / V;
  bool bad = false;
  for (int64_t i = first; i < groups; i += stride) {
    FloatVec<V> g = load_vec<V>(grad + i * V);
    for (int k = 0; k < V; ++k) bad |= kernels::unscale_element(g.v[k], inv_scale);
    store_vec<V>(grad + i * V, g);
  }
  for (int64_t i = groups * V + first; i < n; i += stride) bad |= kernels::unscale_element(grad[i], inv_scale);
  // Every thread of the (whole-warp) block reaches the vote: no thread left the loops early.
  if (__any_sync(kFullWarp, bad) && threadIdx.x % kWarpSize == 0) atomicOr(found_inf, 1);
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
