// The host launchers of adamw.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops::cuda {

// ---- adamw.cu: ops::fused_adamw_ over many tensors at once ----
// One parameter's flat buffers of n floats each (param, m, v updated in place).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
};
// One AdamW step for every tensor of the list, in as few launches as the kernel's parameter space allows (one
// for up to 36 tensors and 320 chunks of 64 Ki elements). `constants` from kernels::adamw_constants(..., step).
cudaError_t fused_adamw(const AdamWTensor* tensors, int count, const minidl::kernels::AdamWConstants& constants,
                        cudaStream_t stream);

}  // namespace minidl::ops::cuda
