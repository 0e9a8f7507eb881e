// Casts between f32 and the 16-bit float storage types on the GPU (ops/cast.h; CPU reference ops/cpu/cast.cpp):
// round to nearest even both ways (__float2half_rn, __float2bfloat16_rn), the same bits as the CPU's conversions
// for every non-NaN value; to f32 is exact.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/cast.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Four 16-bit values moved as one 64-bit access, next to the 128-bit access of their four floats.
template <class H>
struct alignas(8) HalfVec {
  H v[4];
};

__device__ __forceinline__ __half from_float(float x, __half*) { return __float2half_rn(x); }
__device__ __forceinline__ __nv_bfloat16 from_float(float x, __nv_bfloat16*) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Grid-stride over groups of four elements (vectorised when kVec: both pointers aligned for the vector types),
// then the last n % 4 elements one at a time.
template <class H, bool kVec>
__global__ void __launch_bounds__(kThreads) float_to_half_kernel(const float* src, H* dst, int64_t n) {
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
  const int64_t groups = kVec ? n / 4 : 0;
  for (int64_t g = first; g < groups; g += stride) {
    const FloatVec<4> x = load_vec<4>(src + 4 * g);
    HalfVec<H> h;
    for (int k = 0; k < 4; ++k) h.v[k] = from_float(x.v[k], static_cast<H*>(nullptr));
    *reinterpret_cast<HalfVec<H>*>(dst + 4 * g) = h;
  }
  for (int64_t i = 4 * groups + first; i < n; i += stride) dst[i] = from_float(src[i], static_cast<H*>(nullptr));
}

template <class H, bool kVec>
__global__ void __launch_bounds__(kThreads) half_to_float_kernel(const H* src, float* dst, int64_t n) {
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
  const int64_t groups = kVec ? n / 4 : 0;
  for (int64_t g = first; g < groups; g += stride) {
    const HalfVec<H> h = *reinterpret_cast<const HalfVec<H>*>(src + 4 * g);
    FloatVec<4> x;
    for (int k = 0; k < 4; ++k) x.v[k] = to_float(h.v[k]);
    store_vec<4>(dst + 4 * g, x);
  }
  for (int64_t i = 4 * groups + first; i < n; i += stride) dst[i] = to_float(src[i]);
}

bool aligned_for_vectors(const float* f, const void* h) {
  return aligned16(f) && reinterpret_cast<uintptr_t>(h) % 8 == 0;
}

template <class H>
cudaError_t launch_to_half(const float* src, H* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const dim3 grid(grid_stride_blocks(n / 4 + 1, kThreads)), block(kThreads);
  if (aligned_for_vectors(src, dst))
    return launch_kernel(float_to_half_kernel<H, true>, grid, block, 0, stream, src, dst, n);
  return launch_kernel(float_to_half_kernel<H, false>, grid, block, 0, stream, src, dst, n);
}

template <class H>
cudaError_t launch_to_float(const H* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const dim3 grid(grid_stride_blocks(n / 4 + 1, kThreads)), block(kThreads);
  if (aligned_for_vectors(dst, src))
    return launch_kernel(half_to_float_kernel<H, true>, grid, block, 0, stream, src, dst, n);
  return launch_kernel(half_to_float_kernel<H, false>, grid, block, 0, stream, src, dst, n);
}

}  // namespace

cudaError_t cast_f32_to_f16(const float* src, __half* dst, int64_t n, cudaStream_t stream) {
  return launch_to_half(src, dst, n, stream);
}
cudaError_t cast_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream) {
  return launch_to_half(src, dst, n, stream);
}
cudaError_t cast_f16_to_f32(const __half* src, float* dst, int64_t n, cudaStream_t stream) {
  return launch_to_float(src, dst, n, stream);
}
cudaError_t cast_bf16_to_f32(const __nv_bfloat16* src, float* dst, int64_t n, cudaStream_t stream) {
  return launch_to_float(src, dst, n, stream);
}

}  // namespace minidl::ops::cuda
