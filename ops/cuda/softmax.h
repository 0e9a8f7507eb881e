// The host launchers of softmax.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- softmax.cu: ops::softmax_forward / softmax_backward over the last dimension ----
// x, y: (rows, V), V >= 1.
cudaError_t softmax_forward(const float* x, float* y, int64_t rows, int64_t V, cudaStream_t stream);
// dy, y, dx: (rows, V); dx = y * (dy - sum(dy * y)) per row.
cudaError_t softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t V, cudaStream_t stream);

}  // namespace minidl::ops::cuda
