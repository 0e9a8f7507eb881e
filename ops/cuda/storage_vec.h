// Loads and stores of float, f16 and bf16 storage as f32 values, for kernels templated on their activation's
// storage type (layernorm.cu, bias_gelu.cu): 16-bit tensors are read and written directly, the math is f32, and
// each 16-bit result is rounded once (round to nearest even, as ops::cast does on the CPU).
#pragma once

#include "ops/cuda/device_utils.h"

namespace minidl::ops::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void from_float(float x, float* out) { *out = x; }
__device__ __forceinline__ void from_float(float x, __half* out) { *out = __float2half_rn(x); }
__device__ __forceinline__ void from_float(float x, __nv_bfloat16* out) { *out = __float2bfloat16_rn(x); }

// x rounded to T and back: the value an f32 result has once stored in T.
template <class T>
__device__ __forceinline__ float rounded_to(float x) {
  T t;
  from_float(x, &t);
  return to_float(t);
}

// N consecutive elements of T moved as one access (N * sizeof(T) bytes: 128 bits for 4 floats, 64 for 4 halves).
template <class T, int N>
struct alignas(sizeof(T) * N) StorageVec {
  T v[N];
};

template <int N, class T>
__device__ __forceinline__ FloatVec<N> load_floats(const T* p) {
  const StorageVec<T, N> s = *reinterpret_cast<const StorageVec<T, N>*>(p);
  FloatVec<N> out;
  for (int k = 0; k < N; ++k) out.v[k] = to_float(s.v[k]);
  return out;
}

template <int N, class T>
__device__ __forceinline__ void store_floats(T* p, const FloatVec<N>& x) {
  StorageVec<T, N> s;
  for (int k = 0; k < N; ++k) from_float(x.v[k], &s.v[k]);
  *reinterpret_cast<StorageVec<T, N>*>(p) = s;
}

// Whether every pointer is aligned for StorageVec<T, 4> accesses (T the pointer's own type).
template <class... Ptrs>
__host__ __device__ __forceinline__ bool aligned_vec4(const Ptrs*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % (4 * sizeof(Ptrs)) == 0) && ...);
}

}  // namespace minidl::ops::cuda
