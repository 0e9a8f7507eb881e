// The host launchers of embedding.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- embedding.cu: ops::embedding_forward / embedding_backward ----
// weight: (vocab, C); ids: n i64 positions, each in [0, vocab) (not checked here) -> out (n, C).
cudaError_t embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t n, int C,
                              cudaStream_t stream);
// grad_out: (n, C) -> dweight (vocab, C), overwritten. deterministic: each row adds its positions in increasing
// order (the CPU op's bits, on every run); otherwise float atomics (faster on skewed ids, last bits vary).
cudaError_t embedding_backward(const float* grad_out, const int64_t* ids, float* dweight, int64_t n, int64_t vocab,
                               int C, bool deterministic, cudaStream_t stream);

}  // namespace minidl::ops::cuda
