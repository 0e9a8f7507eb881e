// ops/sample_windows.h on a device: the training batch gathered from a split that lives there, so a step copies
// nothing to the device for it. One block per row (grid-stride over rows): every thread of the block computes the
// row's Philox draw itself (ten rounds of a few multiplies, cheaper than a shared-memory broadcast and its
// __syncthreads) and copies a strided part of the window. The start is kernels::window_start, the function the
// host sampler calls, so both pick the same windows bit for bit.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/sample_windows.h"
#include "ops/kernels/sample_windows.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    sample_windows_kernel(const int32_t* tokens, int64_t len, int64_t seq, uint64_t seed, uint64_t stream,
                          int64_t global_batch, int64_t step_value, const int64_t* step, int64_t begin, int64_t n,
                          int64_t* x, int64_t* y) {
  const uint64_t s = uint64_t(step != nullptr ? *step : step_value);
  const Philox rng(seed, stream);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const uint64_t start =
        kernels::window_start(rng, s, uint64_t(global_batch), uint64_t(begin + r), uint64_t(len - seq));
    const int32_t* window = tokens + start;
    for (int64_t i = threadIdx.x; i < seq; i += kThreads) {
      x[r * seq + i] = window[i];
      y[r * seq + i] = window[i + 1];
    }
  }
}

}  // namespace

cudaError_t sample_windows(const int32_t* tokens, int64_t len, int64_t seq, uint64_t seed, uint64_t stream,
                           int64_t global_batch, int64_t step_value, const int64_t* step, int64_t begin, int64_t n,
                           int64_t* x, int64_t* y, cudaStream_t cuda_stream) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(sample_windows_kernel, dim3(grid_stride_blocks(n, 1)), dim3(kThreads), 0, cuda_stream, tokens,
                       len, seq, seed, stream, global_batch, step_value, step, begin, n, x, y);
}

}  // namespace minidl::ops::cuda
