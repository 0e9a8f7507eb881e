// Tensor::fill_ / full / ones on a device (core's DeviceBackend::fill, core/cuda/backend.cpp): every element set to
// one value given as its bytes, so one kernel serves every dtype without a host copy of the tensor.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/fill.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* dst, int64_t n, T value) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) dst[i] = value;
}

template <class T>
cudaError_t launch_fill(void* dst, int64_t n, uint64_t pattern, cudaStream_t stream) {
  T value;
  memcpy(&value, &pattern, sizeof value);  // the low sizeof(T) bytes (little-endian, as every CUDA host is)
  return launch_kernel(fill_kernel<T>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream,
                       static_cast<T*>(dst), n, value);
}

}  // namespace

cudaError_t fill_bytes(void* dst, int64_t n, int element_bytes, uint64_t pattern, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (element_bytes) {
    case 1: return launch_fill<uint8_t>(dst, n, pattern, stream);
    case 2: return launch_fill<uint16_t>(dst, n, pattern, stream);
    case 4: return launch_fill<uint32_t>(dst, n, pattern, stream);
    case 8: return launch_fill<uint64_t>(dst, n, pattern, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace minidl::ops::cuda
