// The host launchers of dropout.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- dropout.cu: ops::dropout (f32) ----
// y (n) = x * keep / (1 - p) with the CPU's mask (ops/kernels/dropout.h), bit for bit; backward is the same call
// on the gradient. `stream` is the Philox stream id, `cuda_stream` the CUDA stream.
cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream, uint64_t offset,
                    cudaStream_t cuda_stream);
// The same with the Philox offset + *step * offset_per_step, *step read when the kernel runs (a CUDA graph's
// replay draws the step's current masks); step == nullptr: offset alone.
cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream, uint64_t offset,
                    const int64_t* step, uint64_t offset_per_step, cudaStream_t cuda_stream);

}  // namespace minidl::ops::cuda
