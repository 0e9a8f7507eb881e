// The second half of a deterministic column sum: kernels that reduce over rows (layernorm's dweight/dbias,
// bias_gelu's dbias) write one partial sum per column per fixed group of rows, and this kernel adds the groups in
// order. No float atomics anywhere: the result has the same bits on every run and every GPU. The sums are f32 and
// rounded once to the output's storage type (f32, or f16/bf16 for a 16-bit bias gradient).
#pragma once

#include <cstdint>

#include "ops/cuda/storage_vec.h"

namespace minidl::ops::cuda {

// out_y[c] = sum over p < parts of partials[(y * parts + p) * C + c], for y = blockIdx.y (0 -> out0, 1 -> out1).
// One thread per column: consecutive threads read consecutive columns of a partial row, so every load is
// coalesced, and each thread adds its column's partials in a fixed order. (A template also lets the definition sit
// in a header used by several .cu files: nvcc rejects `inline` on a __global__ function.)
template <class Out>
__global__ void sum_partials_kernel(const float* partials, int64_t parts, int C, Out* out0, Out* out1) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* column = partials + blockIdx.y * parts * C + c;
  float sum = 0.0f;
  for (int64_t p = 0; p < parts; ++p) sum += column[p * C];
  from_float(sum, (blockIdx.y == 0 ? out0 : out1) + c);
}

// Launches sum_partials_kernel for `outputs` (1 or 2) sums of `parts` partial rows of C columns.
template <class Out>
cudaError_t sum_partials(const float* partials, int64_t parts, int C, Out* out0, Out* out1, unsigned outputs,
                         cudaStream_t stream) {
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), outputs);
  return launch_kernel(sum_partials_kernel<Out>, grid, dim3(kThreads), 0, stream, partials, parts, C, out0, out1);
}

}  // namespace minidl::ops::cuda
