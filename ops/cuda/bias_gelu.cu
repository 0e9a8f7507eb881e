// Fused bias + GELU forward and backward on the GPU (ops/gelu.h; CPU reference ops/cpu/gelu.cpp). The per-element
// math is ops/kernels/gelu.h, the same function the CPU loop calls.
//
// Templated on the storage type T of x, bias, y, dy, dx and dbias (f32, f16 or bf16), read and written directly:
// the math is f32 on the exact f32 values, each 16-bit output rounded once; dbias is summed in f32 (fixed-order
// partials) and rounded once at the end, as the CPU op computes it.
#include "ops/cuda/bias_gelu.h"
#include "ops/cuda/partial_sums.h"
#include "ops/cuda/storage_vec.h"
#include "ops/kernels/gelu.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
// Backward: each thread sums its column over this many rows into one partial; sum_partials adds the partials.
// 32 rows make the partials 1/32 of dx's size while leaving thousands of blocks for a GPT-sized activation.
constexpr int64_t kRowsPerPartial = 32;
constexpr int64_t kMaxGridRows = 65535;  // CUDA's limit on gridDim.y

// expf rather than the __expf intrinsic: the kernel is memory-bound, so the accurate exp costs no time and keeps
// the result within a few ulp of the CPU's.
struct DeviceExp {
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};

// Grid-stride over groups of V elements. With C % V == 0 a group never crosses a row, so its bias is the V
// consecutive floats at (i % C): both loads are V-wide and coalesced.
template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_forward_kernel(const T* x, const T* bias, T* y, int64_t n, int C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    FloatVec<V> v = load_floats<V>(x + i);
    const FloatVec<V> b = load_floats<V>(bias + i % C);
    for (int k = 0; k < V; ++k) v.v[k] = kernels::gelu_tanh(v.v[k] + b.v[k], DeviceExp{});
    store_floats<V>(y + i, v);
  }
}

// One thread per column (consecutive threads, consecutive addresses: coalesced), grid-stride over groups of
// kRowsPerPartial rows on the grid's y axis. The thread writes dx for its column of the group and the group's
// column sum into partials[group * C + c]: dbias without atomics, in a fixed order.
template <class T>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_backward_kernel(const T* dy, const T* x, const T* bias, T* dx, float* partials, int64_t rows, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float b = to_float(bias[c]);
  for (int64_t group = blockIdx.y; group * kRowsPerPartial < rows; group += gridDim.y) {
    const int64_t end =
        group * kRowsPerPartial + kRowsPerPartial < rows ? group * kRowsPerPartial + kRowsPerPartial : rows;
    float sum = 0.0f;
    for (int64_t i = group * kRowsPerPartial * C + c; i < end * C; i += C) {
      const float d = to_float(dy[i]) * kernels::gelu_tanh_grad(to_float(x[i]) + b, DeviceExp{});
      from_float(d, dx + i);
      sum += d;
    }
    partials[group * C + c] = sum;
  }
}

int64_t partial_rows(int64_t rows) { return (rows + kRowsPerPartial - 1) / kRowsPerPartial; }

template <class T>
cudaError_t launch_forward(const T* x, const T* bias, T* y, int64_t rows, int C, cudaStream_t stream) {
  const int64_t n = rows * C;
  if (n == 0) return cudaSuccess;
  if (C % 4 == 0 && aligned_vec4(x, bias, y))
    return launch_kernel(bias_gelu_forward_kernel<4, T>, dim3(grid_stride_blocks(n / 4, kThreads)), dim3(kThreads), 0,
                         stream, x, bias, y, n, C);
  return launch_kernel(bias_gelu_forward_kernel<1, T>, dim3(grid_stride_blocks(n, kThreads)), dim3(kThreads), 0, stream,
                       x, bias, y, n, C);
}

// dx is the f32 d rounded to T, but dbias sums the f32 d (not the rounded dx): the rounding happens once, at the end.
template <class T>
cudaError_t launch_backward(const T* dy, const T* x, const T* bias, T* dx, T* dbias, float* scratch, int64_t rows,
                            int C, cudaStream_t stream) {
  if (C == 0) return cudaSuccess;
  const int64_t groups = partial_rows(rows);
  if (groups > 0) {
    const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                    static_cast<unsigned>(groups < kMaxGridRows ? groups : kMaxGridRows));
    const cudaError_t launched =
        launch_kernel(bias_gelu_backward_kernel<T>, grid, dim3(kThreads), 0, stream, dy, x, bias, dx, scratch, rows, C);
    if (launched != cudaSuccess) return launched;
  }
  return sum_partials(scratch, groups, C, dbias, static_cast<T*>(nullptr), 1, stream);
}

}  // namespace

size_t bias_gelu_backward_scratch_floats(int64_t rows, int C) {
  return static_cast<size_t>(partial_rows(rows)) * static_cast<size_t>(C);
}

#define MINIDL_BIAS_GELU_LAUNCHERS(T)                                                                        \
  cudaError_t bias_gelu_forward(const T* x, const T* bias, T* y, int64_t rows, int C, cudaStream_t stream) { \
    return launch_forward(x, bias, y, rows, C, stream);                                                      \
  }                                                                                                          \
  cudaError_t bias_gelu_backward(const T* dy, const T* x, const T* bias, T* dx, T* dbias, float* scratch,    \
                                 int64_t rows, int C, cudaStream_t stream) {                                 \
    return launch_backward(dy, x, bias, dx, dbias, scratch, rows, C, stream);                                \
  }
MINIDL_BIAS_GELU_LAUNCHERS(float)
MINIDL_BIAS_GELU_LAUNCHERS(__half)
MINIDL_BIAS_GELU_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_BIAS_GELU_LAUNCHERS

}  // namespace minidl::ops::cuda
