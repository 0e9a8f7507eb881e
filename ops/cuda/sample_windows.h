// The host launcher of sample_windows.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: ops/sample_windows.h's
// entry checks first. Work is enqueued on `cuda_stream`; returns the launch error (cudaSuccess when launched).
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// For row r in [0, n): start = kernels::window_start(Philox(seed, stream), s, global_batch, begin + r, len - seq)
// with s = *step when step != nullptr (read when the kernel runs), else step_value;
// x[r * seq + i] = tokens[start + i], y[r * seq + i] = tokens[start + i + 1] for i in [0, seq).
cudaError_t sample_windows(const int32_t* tokens, int64_t len, int64_t seq, uint64_t seed, uint64_t stream,
                           int64_t global_batch, int64_t step_value, const int64_t* step, int64_t begin, int64_t n,
                           int64_t* x, int64_t* y, cudaStream_t cuda_stream);

}  // namespace minidl::ops::cuda
