// Device helpers shared by the kernels in ops/cuda/: warp reductions, aligned vector loads, grid sizing.
// Like the kernels, this builds with nvcc and with the host compiler against the emulator (cuda_compat.h).
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kWarpSize = 32;

// Grid-stride kernels launch at most this many blocks: enough to fill any current GPU several times over, and a
// constant rather than a multiple of the SM count, so results never depend on which GPU ran them.
constexpr int64_t kMaxGridBlocks = 4096;

// Sum over the 32 lanes of a full warp, the result in every lane. Shuffles keep the reduction in registers: no
// shared memory and no __syncthreads, and the butterfly order is fixed, so the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// N consecutive floats moved as one access: with N = 4 one 128-bit load or store (ld.global.v4.f32) instead of
// four, which is what lets a memory-bound kernel reach full bandwidth. Only for addresses aligned to 4 * N bytes.
template <int N>
struct alignas(4 * N) FloatVec {
  float v[N];
};

template <int N>
__device__ __forceinline__ FloatVec<N> load_vec(const float* p) {
  return *reinterpret_cast<const FloatVec<N>*>(p);
}
template <int N>
__device__ __forceinline__ void store_vec(float* p, const FloatVec<N>& x) {
  *reinterpret_cast<FloatVec<N>*>(p) = x;
}

// Whether every pointer is 16-byte aligned, so 4-float vectors can be used from it.
template <class... Ptrs>
__host__ __device__ __forceinline__ bool aligned16(const Ptrs*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % 16 == 0) && ...);
}

// Blocks for a grid-stride loop over `work` items handled `per_block` at a time, at least 1 and at most
// kMaxGridBlocks.
inline unsigned grid_stride_blocks(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxGridBlocks ? kMaxGridBlocks : blocks);
}

}  // namespace minidl::ops::cuda
