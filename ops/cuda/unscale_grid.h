// The body of the unscale kernels (ops/cuda/unscale.cu, and loss_scale.cu's with the scale read on the device):
// one grid-stride pass that multiplies by inv_scale in place and raises *found_inf if any result is inf or NaN.
#pragma once

#include "ops/cuda/device_utils.h"
#include "ops/kernels/unscale.h"

namespace minidl::ops::cuda {

// Grid-stride over groups of V floats (V = 4: 128-bit accesses), then the last n % V elements one at a time.
// Each thread ORs its own flags; one vote per warp and one atomic per warp that saw a bad value keep the flag's
// atomics off the common (all finite) path entirely. Every thread of the (whole-warp) block must call it.
template <int V>
__device__ __forceinline__ void unscale_grid(float* grad, int64_t n, float inv_scale, int* found_inf) {
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

}  // namespace minidl::ops::cuda
