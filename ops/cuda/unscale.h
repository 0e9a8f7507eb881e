// The host launchers of unscale.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- unscale.cu: ops::unscale_and_check_ ----
// grad (n floats) *= inv_scale in place; sets *found_inf to 1 if any result is inf or NaN, and leaves it alone
// otherwise, so one flag (zeroed by the caller) collects every gradient of a step without a host round trip.
cudaError_t unscale_and_check(float* grad, int64_t n, float inv_scale, int* found_inf, cudaStream_t stream);

}  // namespace minidl::ops::cuda
