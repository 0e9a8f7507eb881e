// SwiGLU forward and backward on the GPU (ops/swiglu.h; CPU reference ops/cpu/swiglu.cpp). The per-element math
// is ops/kernels/swiglu.h, the function the CPU's scalar path calls, with expf (the CPU's vector code has its own
// exp, within 2 ulp: the two agree to a few ulp, not bit for bit).
//
// Grid-stride over groups of V elements (V = 4 when the pointers allow 128-bit or 64-bit accesses), templated on
// the storage type T (f32, f16 or bf16), read and written directly, math in f32, each 16-bit result rounded once.
#include "ops/cuda/storage_vec.h"
#include "ops/cuda/swiglu.h"
#include "ops/kernels/swiglu.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

// expf rather than __expf: the kernels are memory-bound, so the accurate exp costs no time.
struct DeviceExp {
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};

template <int V, class T>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(const T* gate, const T* up, T* y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    FloatVec<V> g = load_floats<V>(gate + i);
    const FloatVec<V> u = load_floats<V>(up + i);
    for (int k = 0; k < V; ++k) g.v[k] = kernels::swiglu(g.v[k], u.v[k], DeviceExp{});
    store_floats<V>(y + i, g);
  }
}

template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    const FloatVec<V> d = load_floats<V>(dy + i), g = load_floats<V>(gate + i), u = load_floats<V>(up + i);
    FloatVec<V> dg, du;
    for (int k = 0; k < V; ++k) kernels::swiglu_grad(d.v[k], g.v[k], u.v[k], &dg.v[k], &du.v[k], DeviceExp{});
    store_floats<V>(dgate + i, dg);
    store_floats<V>(dup + i, du);
  }
}

template <class T>
cudaError_t launch_forward(const T* gate, const T* up, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n % 4 == 0 && aligned_vec4(gate, up, y))
    return launch_kernel(swiglu_forward_kernel<4, T>, dim3(grid_stride_blocks(n / 4, kThreads)), dim3(kThreads), 0,
                         stream, gate, up, y, n);
  return launch_kernel(swiglu_forward_kernel<1, T>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream,
                       gate, up, y, n);
}

template <class T>
cudaError_t launch_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n % 4 == 0 && aligned_vec4(dy, gate, up, dgate, dup))
    return launch_kernel(swiglu_backward_kernel<4, T>, dim3(grid_stride_blocks(n / 4, kThreads)), dim3(kThreads), 0,
                         stream, dy, gate, up, dgate, dup, n);
  return launch_kernel(swiglu_backward_kernel<1, T>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream,
                       dy, gate, up, dgate, dup, n);
}

}  // namespace

#define MINIDL_SWIGLU_LAUNCHERS(T)                                                                  \
  cudaError_t swiglu_forward(const T* gate, const T* up, T* y, int64_t n, cudaStream_t stream) {    \
    return launch_forward(gate, up, y, n, stream);                                                  \
  }                                                                                                 \
  cudaError_t swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, \
                              cudaStream_t stream) {                                                \
    return launch_backward(dy, gate, up, dgate, dup, n, stream);                                    \
  }
MINIDL_SWIGLU_LAUNCHERS(float)
MINIDL_SWIGLU_LAUNCHERS(__half)
MINIDL_SWIGLU_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_SWIGLU_LAUNCHERS

}  // namespace minidl::ops::cuda
