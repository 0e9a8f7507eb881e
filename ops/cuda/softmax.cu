// Softmax over the last dimension on the GPU (ops/softmax.h; CPU reference ops/cpu/softmax.cpp).
//
// One warp per row: lanes read the row at consecutive addresses (coalesced) and combine with shuffles, so there is
// no shared memory and no block barrier, and short rows keep every lane busy. The forward computes the row's max
// and its sum of exp(x - max) in one pass (the online softmax: a lane rescales its running sum whenever its max
// grows), then writes exp(x - max) / sum in a second; the CPU needs three passes for the same result.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/softmax.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;

// exp(x - m), treating a running max of -inf (nothing seen yet) as contributing nothing: exp(-inf - -inf) would be
// NaN.
__device__ __forceinline__ float scaled_exp(float x, float m) { return m == -INFINITY ? 0.0f : expf(x - m); }

__global__ void __launch_bounds__(kThreads) softmax_forward_kernel(const float* x, float* y, int64_t rows, int64_t V) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const float* xr = x + row * V;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = lane; j < V; j += kWarpSize) {
    const float v = xr[j];
    if (v > m) {
      s = s * scaled_exp(m, v) + 1.0f;
      m = v;
    } else {
      s += scaled_exp(v, m);
    }
  }
  // Merge the lanes' (max, sum) pairs: each sum is rescaled to the larger max.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float om = __shfl_xor_sync(kFullWarp, m, offset), os = __shfl_xor_sync(kFullWarp, s, offset);
    const float nm = om > m ? om : m;
    s = s * scaled_exp(m, nm) + os * scaled_exp(om, nm);
    m = nm;
  }
  const float inv = 1.0f / s;
  float* yr = y + row * V;
  for (int64_t j = lane; j < V; j += kWarpSize) yr[j] = expf(xr[j] - m) * inv;
}

__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(const float* dy, const float* y, float* dx, int64_t rows, int64_t V) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const float *yr = y + row * V, *dyr = dy + row * V;
  float dot = 0.0f;
  for (int64_t j = lane; j < V; j += kWarpSize) dot += dyr[j] * yr[j];
  dot = warp_sum(dot);
  float* dxr = dx + row * V;
  for (int64_t j = lane; j < V; j += kWarpSize) dxr[j] = yr[j] * (dyr[j] - dot);
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

cudaError_t softmax_forward(const float* x, float* y, int64_t rows, int64_t V, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(softmax_forward_kernel, dim3(blocks_for(rows)), dim3(kThreads), 0, stream, x, y, rows, V);
}

cudaError_t softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t V, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(softmax_backward_kernel, dim3(blocks_for(rows)), dim3(kThreads), 0, stream, dy, y, dx, rows, V);
}

}  // namespace minidl::ops::cuda
