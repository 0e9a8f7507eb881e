// dist's device kernels (kernels.h): one grid-stride loop per operation and element type. They are memory-bound
// and trivially parallel, so the plain loop is the whole story: no shared memory, no warp tricks.
#include "dist/cuda/kernels.h"

namespace minidl::dist::cuda_kernels {
namespace {

constexpr int kThreads = 256;
// At most this many blocks, whatever n: the grid-stride loop covers the rest (the same cap as ops/cuda's).
constexpr int64_t kMaxBlocks = 4096;

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

template <class T>
__global__ void __launch_bounds__(kThreads) sum_into_kernel(T* dst, const T* src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) dst[i] = T(dst[i] + src[i]);
}

template <class T>
__global__ void __launch_bounds__(kThreads) max_into_kernel(T* dst, const T* src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    dst[i] = src[i] > dst[i] ? src[i] : dst[i];
}

template <class T>
__global__ void __launch_bounds__(kThreads) divide_kernel(T* data, int64_t n, T divisor) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) data[i] = T(data[i] / divisor);
}

template <class T>
cudaError_t launch_combine(Combine combine, void* dst, const void* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto* d = static_cast<T*>(dst);
  auto* s = static_cast<const T*>(src);
  if (combine == Combine::kMax) return launch_kernel(max_into_kernel<T>, blocks_for(n), kThreads, 0, stream, d, s, n);
  return launch_kernel(sum_into_kernel<T>, blocks_for(n), kThreads, 0, stream, d, s, n);
}

template <class T>
cudaError_t launch_divide(void* data, int64_t n, int divisor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(divide_kernel<T>, blocks_for(n), kThreads, 0, stream, static_cast<T*>(data), n, T(divisor));
}

}  // namespace

cudaError_t combine_into(ElementType type, Combine combine, void* dst, const void* src, int64_t n,
                         cudaStream_t stream) {
  switch (type) {
    case ElementType::kF32: return launch_combine<float>(combine, dst, src, n, stream);
    case ElementType::kF64: return launch_combine<double>(combine, dst, src, n, stream);
    case ElementType::kI32: return launch_combine<int32_t>(combine, dst, src, n, stream);
    case ElementType::kI64: return launch_combine<int64_t>(combine, dst, src, n, stream);
    case ElementType::kU8: return launch_combine<uint8_t>(combine, dst, src, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t divide_by(ElementType type, void* data, int64_t n, int divisor, cudaStream_t stream) {
  switch (type) {
    case ElementType::kF32: return launch_divide<float>(data, n, divisor, stream);
    case ElementType::kF64: return launch_divide<double>(data, n, divisor, stream);
    case ElementType::kI32: return launch_divide<int32_t>(data, n, divisor, stream);
    case ElementType::kI64: return launch_divide<int64_t>(data, n, divisor, stream);
    case ElementType::kU8: return launch_divide<uint8_t>(data, n, divisor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace minidl::dist::cuda_kernels
