// Dropout on the GPU (ops/dropout.h; CPU reference ops/cpu/dropout.cpp) with the CPU's Philox stream: element i
// is kept iff 16 bits of Philox(seed, stream).draw(offset + i / 8) reach p's threshold (kernels::dropout_keep8, the
// function the CPU loop calls), so both devices drop exactly the same elements and keep the same values (one f32
// multiply by the same scale). Backward is the same call on the gradient: the mask is recomputed, never stored. The
// offset may take a step read from device memory (ops::DropoutStep): under a CUDA graph the arguments are frozen at
// capture, the step's value is not.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/dropout.h"
#include "ops/kernels/dropout.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride over groups of eight elements, one Philox draw each: a thread's draw covers two 128-bit loads and
// stores when kVec (x and y 16-byte aligned); the last, partial group and unaligned tensors go element by element.
// With `step`, the draws start at offset + *step * offset_per_step (the host's unsigned arithmetic).
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const float* x, float* y, int64_t n, uint32_t threshold, float scale, uint64_t seed, uint64_t stream,
                   uint64_t offset, const int64_t* step, uint64_t offset_per_step) {
  constexpr int kPer = kernels::kDropoutPerDraw;
  if (step != nullptr) offset += static_cast<uint64_t>(*step) * offset_per_step;
  const Philox rng(seed, stream);
  const int64_t groups = (n + kPer - 1) / kPer;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x; g < groups; g += stride) {
    bool keep[kPer];
    kernels::dropout_keep8(rng, offset, uint64_t(g), threshold, keep);
    if (kVec && kPer * g + kPer <= n) {
      for (int h = 0; h < kPer / 4; ++h) {
        FloatVec<4> v = load_vec<4>(x + kPer * g + 4 * h);
        for (int k = 0; k < 4; ++k) v.v[k] = keep[4 * h + k] ? v.v[k] * scale : 0.0f;
        store_vec<4>(y + kPer * g + 4 * h, v);
      }
    } else {
      for (int64_t i = kPer * g; i < n && i < kPer * g + kPer; ++i) y[i] = keep[i - kPer * g] ? x[i] * scale : 0.0f;
    }
  }
}

}  // namespace

cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream, uint64_t offset,
                    cudaStream_t cuda_stream) {
  return dropout(x, y, n, p, seed, stream, offset, nullptr, 0, cuda_stream);
}

cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream, uint64_t offset,
                    const int64_t* step, uint64_t offset_per_step, cudaStream_t cuda_stream) {
  if (n == 0) return cudaSuccess;
  // The CPU's constants, rounded the same way: p to float for the threshold, scale = 1 / (1 - p) in f32.
  const uint32_t threshold = kernels::dropout_threshold(float(p));
  const float scale = 1.0f / (1.0f - float(p));
  const dim3 grid(grid_stride_blocks((n + kernels::kDropoutPerDraw - 1) / kernels::kDropoutPerDraw, kThreads)),
      block(kThreads);
  if (aligned16(x, y))
    return launch_kernel(dropout_kernel<true>, grid, block, 0, cuda_stream, x, y, n, threshold, scale, seed, stream,
                         offset, step, offset_per_step);
  return launch_kernel(dropout_kernel<false>, grid, block, 0, cuda_stream, x, y, n, threshold, scale, seed, stream,
                       offset, step, offset_per_step);
}

}  // namespace minidl::ops::cuda
