// The host launchers of cross_entropy.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- cross_entropy.cu: ops::cross_entropy_forward / cross_entropy_backward, for T = float, __half, __nv_bfloat16 ----
// forward: logits (rows, stride) of T, of which the first `classes` columns are classes and the rest padding (never
// read, zero gradients); targets: (rows) i64, each in [0, classes) or ignore_index (not checked here: the op's entry
// checks target values). Writes lse (rows, f32), row_loss (rows; device scratch, 0 for ignored rows), *loss (the mean
// over counted rows when `mean`, else the sum; NaN for a mean over no row) and *count (rows whose target is not
// ignore_index), all on the device. The math is f32, and the loss is added in a fixed order: the same bits on every
// run.
// backward: dloss: device scalar; divisor: device count from the forward for the mean, nullptr for the sum (divisor
// 1). dlogits (rows, stride) = (softmax - onehot) * dloss / divisor in T, zeros for ignored rows and padded columns;
// dlogits may be logits (written in place).
#define MINIDL_CROSS_ENTROPY_DECLARE(T)                                                                                \
  cudaError_t cross_entropy_forward(const T* logits, const int64_t* targets, float* lse, float* row_loss, float* loss, \
                                    int64_t* count, int64_t rows, int64_t classes, int64_t stride,                     \
                                    int64_t ignore_index, bool mean, cudaStream_t stream);                             \
  cudaError_t cross_entropy_backward(const float* dloss, const T* logits, const int64_t* targets, const float* lse,    \
                                     const int64_t* divisor, T* dlogits, int64_t rows, int64_t classes,                \
                                     int64_t stride, int64_t ignore_index, cudaStream_t stream);
MINIDL_CROSS_ENTROPY_DECLARE(float)
MINIDL_CROSS_ENTROPY_DECLARE(__half)
MINIDL_CROSS_ENTROPY_DECLARE(__nv_bfloat16)
#undef MINIDL_CROSS_ENTROPY_DECLARE

}  // namespace minidl::ops::cuda
