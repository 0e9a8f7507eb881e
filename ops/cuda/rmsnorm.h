// The host launchers of rmsnorm.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- rmsnorm.cu: ops::rmsnorm_forward / rmsnorm_backward ----
// x, y: (rows, C) row-major, f32, f16 or bf16 storage (math in f32); weight: (C) f32; rstd: (rows) f32,
// rstd = 1 / sqrt(mean(x^2) + eps); y = round(round(x * rstd) * weight), round: to the storage type. One launch.
// Floats of device scratch that rmsnorm_backward needs for its dweight partial sums.
size_t rmsnorm_backward_scratch_floats(int64_t rows, int C);
// dy, x, dx: (rows, C) in one storage type; weight, dweight: (C) f32; rstd as the forward saved it. dweight
// (= sum_rows dy * round(x * rstd)) is overwritten, with the same bits on every run and every GPU. Two launches.
#define MINIDL_RMSNORM_LAUNCHERS(T)                                                                                    \
  cudaError_t rmsnorm_forward(const T* x, const float* weight, T* y, float* rstd, int64_t rows, int C, float eps,      \
                              cudaStream_t stream);                                                                    \
  cudaError_t rmsnorm_backward(const T* dy, const T* x, const float* weight, const float* rstd, T* dx, float* dweight, \
                               float* scratch, int64_t rows, int C, cudaStream_t stream);
MINIDL_RMSNORM_LAUNCHERS(float)
MINIDL_RMSNORM_LAUNCHERS(__half)
MINIDL_RMSNORM_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_RMSNORM_LAUNCHERS

}  // namespace minidl::ops::cuda
