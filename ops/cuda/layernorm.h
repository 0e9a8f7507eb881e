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
                               const float* rstd, float* dx, float* dweight, float* dbias, float* scratch, int64_t rows,
                               int C, cudaStream_t stream);
cudaError_t layernorm_backward(const __half* dy, const __half* x, const float* weight, const float* mean,
                               const float* rstd, __half* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);
cudaError_t layernorm_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const float* weight, const float* mean,
                               const float* rstd, __nv_bfloat16* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);
// ---- layernorm.cu: ops::add_layernorm_forward / add_layernorm_backward (the residual add fused in) ----
// sum = a + b (rounded to the storage type), then y, mean, rstd = layernorm(sum) as above: one launch.
#define MINIDL_ADD_LAYERNORM_FORWARD(T)                                                                           \
  cudaError_t add_layernorm_forward(const T* a, const T* b, const float* weight, const float* bias, T* sum, T* y, \
                                    float* mean, float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
MINIDL_ADD_LAYERNORM_FORWARD(float)
MINIDL_ADD_LAYERNORM_FORWARD(__half)
MINIDL_ADD_LAYERNORM_FORWARD(__nv_bfloat16)
#undef MINIDL_ADD_LAYERNORM_FORWARD
// dx = layernorm_backward's dx (rounded to the storage type) + dsum, the gradient of sum from its other uses; sum,
// mean and rstd as the forward returned them. dweight, dbias as layernorm_backward; the same scratch.
#define MINIDL_ADD_LAYERNORM_BACKWARD(T)                                                                    \
  cudaError_t add_layernorm_backward(const T* dy, const T* sum, const float* weight, const float* mean,     \
                                     const float* rstd, const T* dsum, T* dx, float* dweight, float* dbias, \
                                     float* scratch, int64_t rows, int C, cudaStream_t stream);
MINIDL_ADD_LAYERNORM_BACKWARD(float)
MINIDL_ADD_LAYERNORM_BACKWARD(__half)
MINIDL_ADD_LAYERNORM_BACKWARD(__nv_bfloat16)
#undef MINIDL_ADD_LAYERNORM_BACKWARD

}  // namespace minidl::ops::cuda
