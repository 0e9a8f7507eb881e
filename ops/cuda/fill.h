// The host launchers of fill.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- fill.cu: Tensor::fill_ on a device (core's DeviceBackend::fill) ----
// dst[0..n) = the value whose bytes are the low element_bytes (1, 2, 4 or 8) bytes of `pattern`.
cudaError_t fill_bytes(void* dst, int64_t n, int element_bytes, uint64_t pattern, cudaStream_t stream);

}  // namespace minidl::ops::cuda
