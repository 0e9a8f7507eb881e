// The host launchers of rope.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the launch error (cudaSuccess when launched); work is enqueued on
// `stream`.
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- rope.cu: ops::rope_forward / rope_backward ----
// x, y: (B, T, H, D) contiguous in one storage type (f32, f16 or bf16; math in f32), D = 2 * half; cos, sin:
// (P, half) f32 with P >= position_offset + T. y = x rotated by the angles of positions position_offset + t in
// the rotate_half layout (ops/rope.h); inverse: by their negatives (the backward). One launch.
#define MINIDL_ROPE_LAUNCHER(T)                                                                               \
  cudaError_t rope(const T* x, const float* cos, const float* sin, T* y, int64_t B, int64_t T_len, int64_t H, \
                   int half, int64_t position_offset, bool inverse, cudaStream_t stream);
MINIDL_ROPE_LAUNCHER(float)
MINIDL_ROPE_LAUNCHER(__half)
MINIDL_ROPE_LAUNCHER(__nv_bfloat16)
#undef MINIDL_ROPE_LAUNCHER

}  // namespace minidl::ops::cuda
