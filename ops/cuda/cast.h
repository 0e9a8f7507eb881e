// The host launchers of cast.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- cast.cu: ops::cast between f32 and f16/bf16 ----
// n elements, round to nearest even to 16 bits (the CPU's bits for every non-NaN value), exact to f32.
cudaError_t cast_f32_to_f16(const float* src, __half* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_f16_to_f32(const __half* src, float* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_bf16_to_f32(const __nv_bfloat16* src, float* dst, int64_t n, cudaStream_t stream);

}  // namespace minidl::ops::cuda
