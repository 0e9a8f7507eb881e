// The host launcher of vocab_range.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: ops/vocab_range.h's entry
// checks first. Work is enqueued on `stream`; returns the launch error (cudaSuccess when launched).
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// For i in [0, n): id = ids[i]; mine = id != ignore_index && start <= id < start + length;
// index[i] = mine ? i * row_stride + id - start : 0, in_range[i] = mine, counted[i] = id != ignore_index.
cudaError_t vocab_range(const int64_t* ids, int64_t n, int64_t start, int64_t length, int64_t row_stride,
                        int64_t ignore_index, int64_t* index, float* in_range, float* counted, cudaStream_t stream);

}  // namespace minidl::ops::cuda
