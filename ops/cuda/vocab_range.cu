// ops/vocab_range.h on a device: one grid-stride pass over the ids, so tensor parallelism's embedding and
// cross-entropy find their rank's ids without copying them to the host.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/vocab_range.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    vocab_range_kernel(const int64_t* ids, int64_t n, int64_t start, int64_t length, int64_t row_stride,
                       int64_t ignore_index, int64_t* index, float* in_range, float* counted) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t id = ids[i];
    const bool mine = id != ignore_index && id >= start && id < start + length;
    index[i] = mine ? i * row_stride + (id - start) : 0;
    in_range[i] = mine ? 1.0f : 0.0f;
    counted[i] = id == ignore_index ? 0.0f : 1.0f;
  }
}

}  // namespace

cudaError_t vocab_range(const int64_t* ids, int64_t n, int64_t start, int64_t length, int64_t row_stride,
                        int64_t ignore_index, int64_t* index, float* in_range, float* counted, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(vocab_range_kernel, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream, ids, n,
                       start, length, row_stride, ignore_index, index, in_range, counted);
}

}  // namespace minidl::ops::cuda
