// The host launchers of layernorm.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- layernorm.cu: ops::layernorm_forward / layernorm_backward ----
// x, y: (rows, C) row-major, f32, f16 or bf16 storage (math in f32); weight, bias: (C) f32; mean, rstd: (rows) f32,
// rstd = 1 / sqrt(var + eps). One launch.
cudaError_t layernorm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                              float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
cudaError_t layernorm_forward(const __half* x, const float* weight, const float* bias, __half* y, float* mean,
                              float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
cudaError_t layernorm_forward(const __nv_bfloat16* x, const float* weight, const float* bias, __nv_bfloat16* y,
                              float* mean, float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
// Floats of device scratch that layernorm_backward needs for its dweight/dbias partial sums.
size_t layernorm_backward_scratch_floats(int64_t rows, int C);
// dy, x, dx: (rows, C) in one storage type; weight, dweight, dbias: (C) f32; mean, rstd as the forward saved them.
// dweight and dbias are overwritten (not accumulated into), with the same bits on every run and every GPU.
cudaError_t layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                               const float* rstd, float* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);
cudaError_t layernorm_backward(const __half* dy, const __half* x, const float* weight, const float* mean,
                               const float* rstd, __half* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);
cudaError_t layernorm_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const float* weight,
                               const float* mean, const float* rstd, __nv_bfloat16* dx, float* dweight, float* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);

}  // namespace minidl::ops::cuda
