// RoPE on the GPU (ops/rope.h; CPU reference ops/cpu/rope.cpp). The rotation of one pair is ops/kernels/rope.h,
// the function the CPU's scalar path calls and whose order of operations its vector code keeps: the emulated
// kernel and the CPU give the same bits.
//
// One thread per pair (x[i], x[i + D/2]) of a head, grid-stride: consecutive threads take consecutive i of a head,
// so each half's loads and the table rows' loads are coalesced. Templated on the storage type T of x and y (f32,
// f16 or bf16), read and written directly, math in f32, each 16-bit result rounded once.
#include "ops/cuda/rope.h"
#include "ops/cuda/storage_vec.h"
#include "ops/kernels/rope.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(const T* x, const float* cos, const float* sin, T* y, int64_t pairs, int64_t T_len, int64_t H, int half,
                int64_t position_offset, bool inverse) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int i = static_cast<int>(p % half);
    const int64_t head = p / half;  // (b, t, h) flattened
    const int64_t position = position_offset + (head / H) % T_len;
    const int64_t at = head * 2 * half + i;
    const float c = cos[position * half + i], s = sin[position * half + i];
    float y0, y1;
    kernels::rope_rotate(to_float(x[at]), to_float(x[at + half]), c, inverse ? -s : s, &y0, &y1);
    from_float(y0, y + at);
    from_float(y1, y + at + half);
  }
}

template <class T>
cudaError_t launch(const T* x, const float* cos, const float* sin, T* y, int64_t B, int64_t T_len, int64_t H, int half,
                   int64_t position_offset, bool inverse, cudaStream_t stream) {
  const int64_t pairs = B * T_len * H * half;
  if (pairs == 0) return cudaSuccess;
  return launch_kernel(rope_kernel<T>, dim3(grid_stride_blocks(pairs, kThreads)), dim3(kThreads), 0, stream, x, cos,
                       sin, y, pairs, T_len, H, half, position_offset, inverse);
}

}  // namespace

#define MINIDL_ROPE_LAUNCHER(T)                                                                               \
  cudaError_t rope(const T* x, const float* cos, const float* sin, T* y, int64_t B, int64_t T_len, int64_t H, \
                   int half, int64_t position_offset, bool inverse, cudaStream_t stream) {                    \
    return launch<T>(x, cos, sin, y, B, T_len, H, half, position_offset, inverse, stream);                    \
  }
MINIDL_ROPE_LAUNCHER(float)
MINIDL_ROPE_LAUNCHER(__half)
MINIDL_ROPE_LAUNCHER(__nv_bfloat16)
#undef MINIDL_ROPE_LAUNCHER

}  // namespace minidl::ops::cuda
