// The host launchers of bias_gelu.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- bias_gelu.cu: ops::bias_gelu_forward / bias_gelu_backward ----
// x, y: (rows, C); bias: (C); all one storage type (f32, f16 or bf16; math in f32); y = gelu(x + bias), tanh
// approximation (ops/kernels/gelu.h). One launch.
cudaError_t bias_gelu_forward(const float* x, const float* bias, float* y, int64_t rows, int C, cudaStream_t stream);
cudaError_t bias_gelu_forward(const __half* x, const __half* bias, __half* y, int64_t rows, int C, cudaStream_t stream);
cudaError_t bias_gelu_forward(const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t rows, int C,
                              cudaStream_t stream);
// Floats of device scratch that bias_gelu_backward needs for its dbias partial sums.
size_t bias_gelu_backward_scratch_floats(int64_t rows, int C);
// dx = dy * gelu'(x + bias); dbias (C) = dx summed over rows in f32 and rounded once to the storage type,
// overwritten, deterministic. Two launches (the rows, then the partial sums).
cudaError_t bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, float* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);
cudaError_t bias_gelu_backward(const __half* dy, const __half* x, const __half* bias, __half* dx, __half* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);
cudaError_t bias_gelu_backward(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                               __nv_bfloat16* dx, __nv_bfloat16* dbias, float* scratch, int64_t rows, int C,
                               cudaStream_t stream);

}  // namespace minidl::ops::cuda
