// Dropout on the GPU (ops/dropout.h; CPU reference ops/cpu/dropout.cpp) with the CPU's Philox stream: element i
// is kept iff Philox(seed, stream).uniform(offset + i / 4, i % 4) >= p (kernels::dropout_keep4, the function the
// CPU loop calls), so both devices drop exactly the same elements and keep the same values (one f32 multiply by
// the same scale). Backward is the same call on the gradient: the mask is recomputed, never stored.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/dropout.h"
#include "ops/kernels/dropout.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride over groups of four elements, one Philox draw each: a thread's draw covers one 128-bit load and
// store when kVec (x and y 16-byte aligned); the last, partial group and unaligned tensors go element by element.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const float* x, float* y, int64_t n, float p, float scale, uint64_t seed, uint64_t stream,
                   uint64_t offset) {
  const Philox rng(seed, stream);
  const int64_t groups = (n + 3) / 4;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x; g < groups; g += stride) {
    bool keep[4];
    kernels::dropout_keep4(rng, offset, uint64_t(g), p, keep);
    if (kVec && 4 * g + 4 <= n) {
      FloatVec<4> v = load_vec<4>(x + 4 * g);
      for (int k = 0; k < 4; ++k) v.v[k] = keep[k] ? v.v[k] * scale : 0.0f;
      store_vec<4>(y + 4 * g, v);
    } else {
      for (int64_t i = 4 * g; i < n && i < 4 * g + 4; ++i) y[i] = keep[i - 4 * g] ? x[i] * scale : 0.0f;
    }
  }
}

}  // namespace

cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream,
                    uint64_t offset, cudaStream_t cuda_stream) {
  if (n == 0) return cudaSuccess;
  // The CPU's constants, rounded the same way: p to float for the comparison, scale = 1 / (1 - p) in f32.
  const float pf = float(p), scale = 1.0f / (1.0f - float(p));
  const dim3 grid(grid_stride_blocks((n + 3) / 4, kThreads)), block(kThreads);
  if (aligned16(x, y))
    return launch_kernel(dropout_kernel<true>, grid, block, 0, cuda_stream, x, y, n, pf, scale, seed, stream,
                         offset);
  return launch_kernel(dropout_kernel<false>, grid, block, 0, cuda_stream, x, y, n, pf, scale, seed, stream,
                       offset);
}

}  // namespace minidl::ops::cuda
