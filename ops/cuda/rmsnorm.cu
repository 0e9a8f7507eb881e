// Fused RMS norm forward and backward on the GPU (ops/rmsnorm.h; CPU reference ops/cpu/rmsnorm.cpp), laid out as
// layernorm.cu: one warp per row, 128-bit accesses when C % 4 == 0 and the pointers are aligned, the sum of squares
// reduced with warp shuffles (f32, a fixed butterfly order; the CPU sums in f64: they agree to ~1e-6 relative).
//
// Templated on the storage type T of x, y, dy, dx (f32, f16 or bf16), read and written directly: xhat = x * rstd
// is rounded to T before the weight multiplies it, and the product rounded again (transformers' LlamaRMSNorm).
#include "ops/cuda/partial_sums.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/storage_vec.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // rows in flight per block of 256 threads
// Backward: at most this many blocks, so the dweight partials (one row of C per warp) stay small and their number
// depends on `rows` only, never on the GPU.
constexpr int64_t kMaxBackwardBlocks = 128;

template <int V, class T>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    rmsnorm_forward_kernel(const T* x, const float* weight, T* y, float* rstd, int64_t rows, int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together; this kernel has no block barrier
  const T* xr = x + row * C;
  float squares = 0.0f;
  for (int c = lane * V; c < C; c += kWarpSize * V) {
    const FloatVec<V> xv = load_floats<V>(xr + c);
    for (int k = 0; k < V; ++k) squares += xv.v[k] * xv.v[k];
  }
  const float rs = rsqrtf(warp_sum(squares) / C + eps);
  T* yr = y + row * C;
  for (int c = lane * V; c < C; c += kWarpSize * V) {
    FloatVec<V> out = load_floats<V>(xr + c);
    const FloatVec<V> w = load_vec<V>(weight + c);
    for (int k = 0; k < V; ++k) out.v[k] = rounded_to<T>(out.v[k] * rs) * w.v[k];
    store_floats<V>(yr + c, out);
  }
  if (lane == 0) rstd[row] = rs;
}

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * weight, one warp per row, rows strided over the grid's
// warps; each warp adds dy * round(xhat) of its rows into its own partial row of dweight (a lane always touches the
// same columns: no atomics), and sum_partials adds the warps' partials in order.
template <int V, class T>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize, 1)
    rmsnorm_backward_kernel(const T* dy, const T* x, const float* weight, const float* rstd, T* dx, float* partials,
                            int64_t rows, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  float* dw_part = partials + warp * C;
  const FloatVec<V> zero{};
  for (int c = lane * V; c < C; c += kWarpSize * V) store_vec<V>(dw_part + c, zero);
  for (int64_t row = warp; row < rows; row += warps) {
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const float rs = rstd[row];
    float sum_gx = 0.0f;
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      const FloatVec<V> xv = load_floats<V>(xr + c), dyv = load_floats<V>(dyr + c), w = load_vec<V>(weight + c);
      FloatVec<V> dw = load_vec<V>(dw_part + c);
      for (int k = 0; k < V; ++k) {
        const float xhat = xv.v[k] * rs;
        sum_gx += dyv.v[k] * w.v[k] * xhat;
        dw.v[k] += dyv.v[k] * rounded_to<T>(xhat);
      }
      store_vec<V>(dw_part + c, dw);
    }
    const float mean_gx = warp_sum(sum_gx) / C;
    T* dxr = dx + row * C;
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      const FloatVec<V> xv = load_floats<V>(xr + c), dyv = load_floats<V>(dyr + c), w = load_vec<V>(weight + c);
      FloatVec<V> out;
      for (int k = 0; k < V; ++k) out.v[k] = rs * (dyv.v[k] * w.v[k] - xv.v[k] * rs * mean_gx);
      store_floats<V>(dxr + c, out);
    }
  }
}

unsigned forward_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }
unsigned backward_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBackwardBlocks ? kMaxBackwardBlocks : blocks);
}

template <class T>
cudaError_t launch_forward(const T* x, const float* weight, T* y, float* rstd, int64_t rows, int C, float eps,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(forward_blocks(rows)), block(kWarpsPerBlock * kWarpSize);
  const bool vec4 = C % 4 == 0 && aligned_vec4(x, weight, y);
  return launch_kernel(vec4 ? rmsnorm_forward_kernel<4, T> : rmsnorm_forward_kernel<1, T>, grid, block, 0, stream, x,
                       weight, y, rstd, rows, C, eps);
}

template <class T>
cudaError_t launch_backward(const T* dy, const T* x, const float* weight, const float* rstd, T* dx, float* dweight,
                            float* scratch, int64_t rows, int C, cudaStream_t stream) {
  const unsigned blocks = backward_blocks(rows);
  const bool vec4 = C % 4 == 0 && aligned_vec4(dy, x, weight, dx, scratch);
  const cudaError_t launched =
      launch_kernel(vec4 ? rmsnorm_backward_kernel<4, T> : rmsnorm_backward_kernel<1, T>, dim3(blocks),
                    dim3(kWarpsPerBlock * kWarpSize), 0, stream, dy, x, weight, rstd, dx, scratch, rows, C);
  if (launched != cudaSuccess) return launched;
  return sum_partials(scratch, int64_t(blocks) * kWarpsPerBlock, C, dweight, static_cast<float*>(nullptr), 1, stream);
}

}  // namespace

size_t rmsnorm_backward_scratch_floats(int64_t rows, int C) {
  return static_cast<size_t>(backward_blocks(rows) * kWarpsPerBlock) * static_cast<size_t>(C);
}

#define MINIDL_RMSNORM_LAUNCHERS(T)                                                                                    \
  cudaError_t rmsnorm_forward(const T* x, const float* weight, T* y, float* rstd, int64_t rows, int C, float eps,      \
                              cudaStream_t stream) {                                                                   \
    return launch_forward<T>(x, weight, y, rstd, rows, C, eps, stream);                                                \
  }                                                                                                                    \
  cudaError_t rmsnorm_backward(const T* dy, const T* x, const float* weight, const float* rstd, T* dx, float* dweight, \
                               float* scratch, int64_t rows, int C, cudaStream_t stream) {                             \
    return launch_backward<T>(dy, x, weight, rstd, dx, dweight, scratch, rows, C, stream);                             \
  }
MINIDL_RMSNORM_LAUNCHERS(float)
MINIDL_RMSNORM_LAUNCHERS(__half)
MINIDL_RMSNORM_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_RMSNORM_LAUNCHERS

}  // namespace minidl::ops::cuda
