// The host launchers of reduce.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- reduce.cu: ops/reduce.h (sum, mean, max over everything or one dimension; max_backward) and the sums of
// sum_to_shape ----
// Deterministic: partial results are combined in a fixed order that depends on the shape only (no atomics), so
// a reduction gives the same bits on every run and every GPU. Sums accumulate in f32.
enum class ReduceOp { kSum, kMax };
// Floats of device scratch that reduce_all needs for n elements.
size_t reduce_all_scratch_floats(int64_t n);
// *out (device) = scale * sum of x[0..n) (0 for n == 0), or the max (n >= 1; NaN wins; scale unused).
cudaError_t reduce_all(ReduceOp op, const float* x, int64_t n, float scale, float* out, float* scratch,
                       cudaStream_t stream);
// Floats of device scratch that reduce_dim needs (0 when it needs none; then scratch may be nullptr).
size_t reduce_dim_scratch_floats(ReduceOp op, int64_t outer, int64_t n, int64_t inner);
// x: contiguous (outer, n, inner), n >= 1 for kMax -> out (outer, inner) = scale * sum over n, or the max with
// `indices` (outer, inner) the position of its first occurrence along n (NaN wins, as on the CPU).
cudaError_t reduce_dim(ReduceOp op, const float* x, int64_t outer, int64_t n, int64_t inner, float scale, float* out,
                       int64_t* indices, float* scratch, cudaStream_t stream);
// grad, indices: (outer, inner) -> dx (outer, n, inner): grad at each index, 0 elsewhere (every element written).
cudaError_t max_backward(const float* grad, const int64_t* indices, float* dx, int64_t outer, int64_t n, int64_t inner,
                         cudaStream_t stream);

}  // namespace minidl::ops::cuda
