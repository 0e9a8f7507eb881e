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
// x, y: (rows, C); bias: (C); y = gelu(x + bias), tanh approximation (ops/kernels/gelu.h).
cudaError_t bias_gelu_forward(const float* x, const float* bias, float* y, int64_t rows, int C,
                              cudaStream_t stream);
// Floats of device scratch that bias_gelu_backward needs for its dbias partial sums.
size_t bias_gelu_backward_scratch_floats(int64_t rows, int C);
// dx = dy * gelu'(x + bias); dbias (C) = dx summed over rows, overwritten, deterministic.
cudaError_t bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, float* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);

}  // namespace minidl::ops::cuda
