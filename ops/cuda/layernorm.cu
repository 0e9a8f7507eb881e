// Fused layer norm forward and backward on the GPU (ops/layernorm.h; CPU reference ops/cpu/layernorm.cpp).
//
// One warp per row: a row of C floats is read by 32 lanes at consecutive addresses (coalesced, as 128-bit
// vectors when C % 4 == 0 and the pointers are aligned), and its sums are reduced with warp shuffles, so no
// shared memory or block barrier is needed and short rows (GPT's C = 768) keep every lane busy. Statistics are
// f32 in a fixed butterfly order; the CPU accumulates in f64, so the two agree to ~1e-6 relative.
//
// The kernels are templated on the storage type T of the activations (x, y, dy, dx: f32, f16 or bf16), read and
// written directly: 16-bit rows are normalised in f32 with f32 weight, bias, mean and rstd, and each 16-bit output
// element is rounded once, as the CPU op computes them (f32 math on the exact f32 values, then ops::cast).
#include "ops/cuda/layernorm.h"
#include "ops/cuda/partial_sums.h"
#include "ops/cuda/storage_vec.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // rows in flight per block of 256 threads
// Backward: at most this many blocks, whatever the row count, so the dweight/dbias partials (one row of 2C per
// warp) stay small next to dy and x, and their number depends on `rows` only, never on the GPU.
constexpr int64_t kMaxBackwardBlocks = 128;

// Forward. The row is read three times (sum, squared deviations, output): the later passes hit L1/L2, and the
// two-pass variance does not cancel when |mean| >> std. With a residual (add_layernorm), the first pass forms
// s = x + residual, rounded to T as the unfused add would, writes it to sum_out, and the later passes read s back
// (each lane its own columns, just written).
template <int V, class T>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    layernorm_forward_kernel(const T* x, const T* residual, const float* weight, const float* bias, T* sum_out, T* y,
                             float* mean, float* rstd, int64_t rows, int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together; this kernel has no block barrier
  const T* xr = x + row * C;
  float sum = 0.0f;
  if (residual != nullptr) {
    const T* rr = residual + row * C;
    T* sr = sum_out + row * C;
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      FloatVec<V> sv = load_floats<V>(xr + c);
      const FloatVec<V> rv = load_floats<V>(rr + c);
      for (int k = 0; k < V; ++k) {
        sv.v[k] = rounded_to<T>(sv.v[k] + rv.v[k]);
        sum += sv.v[k];
      }
      store_floats<V>(sr + c, sv);
    }
    xr = sr;
  } else {
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      const FloatVec<V> xv = load_floats<V>(xr + c);
      for (int k = 0; k < V; ++k) sum += xv.v[k];
    }
  }
  const float mu = warp_sum(sum) / C;
  float squares = 0.0f;
  for (int c = lane * V; c < C; c += kWarpSize * V) {
    const FloatVec<V> xv = load_floats<V>(xr + c);
    for (int k = 0; k < V; ++k) squares += (xv.v[k] - mu) * (xv.v[k] - mu);
  }
  const float rs = rsqrtf(warp_sum(squares) / C + eps);
  T* yr = y + row * C;
  for (int c = lane * V; c < C; c += kWarpSize * V) {
    FloatVec<V> out = load_floats<V>(xr + c);
    const FloatVec<V> w = load_vec<V>(weight + c), b = load_vec<V>(bias + c);
    for (int k = 0; k < V; ++k) out.v[k] = (out.v[k] - mu) * rs * w.v[k] + b.v[k];
    store_floats<V>(yr + c, out);
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight, one warp per row, rows
// strided over the grid's warps. Each warp also accumulates dweight = sum dy * xhat and dbias = sum dy for its
// rows into its own partial rows (dw_part, db_part); a lane always touches the same columns, so no other thread
// reads or writes them and no atomics are needed. sum_partials then adds the warps' partials in order.
// With dsum (add_layernorm: the gradient of s from its other uses), dx is the layernorm gradient rounded to T plus
// dsum, rounded again: the unfused ops' arithmetic (the autograd engine adds the two gradients of s).
// kDsum is a template flag rather than a null test, so the plain kernel pays nothing for it. A minimum of 1 block
// per SM lets ptxas use up to ~90 registers instead of spilling at its default budget: the grid has at most
// kMaxBackwardBlocks (128) blocks, one per SM on current GPUs, so no occupancy is lost.
template <int V, class T, bool kDsum>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize, 1)
    layernorm_backward_kernel(const T* dy, const T* x, const float* weight, const float* mean, const float* rstd,
                              const T* dsum, T* dx, float* partials, int64_t rows, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  float* dw_part = partials + warp * C;
  float* db_part = partials + (warps + warp) * C;
  const FloatVec<V> zero{};
  for (int c = lane * V; c < C; c += kWarpSize * V) {
    store_vec<V>(dw_part + c, zero);
    store_vec<V>(db_part + c, zero);
  }
  for (int64_t row = warp; row < rows; row += warps) {
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const float m = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      const FloatVec<V> xv = load_floats<V>(xr + c), dyv = load_floats<V>(dyr + c), w = load_vec<V>(weight + c);
      FloatVec<V> dw = load_vec<V>(dw_part + c), db = load_vec<V>(db_part + c);
      for (int k = 0; k < V; ++k) {
        const float xhat = (xv.v[k] - m) * rs, g = dyv.v[k] * w.v[k];
        sum_g += g;
        sum_gx += g * xhat;
        dw.v[k] += dyv.v[k] * xhat;
        db.v[k] += dyv.v[k];
      }
      store_vec<V>(dw_part + c, dw);
      store_vec<V>(db_part + c, db);
    }
    const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
    T* dxr = dx + row * C;
    for (int c = lane * V; c < C; c += kWarpSize * V) {
      const FloatVec<V> xv = load_floats<V>(xr + c), dyv = load_floats<V>(dyr + c), w = load_vec<V>(weight + c);
      FloatVec<V> out;
      for (int k = 0; k < V; ++k) out.v[k] = rs * (dyv.v[k] * w.v[k] - mean_g - (xv.v[k] - m) * rs * mean_gx);
      if constexpr (kDsum) {
        const FloatVec<V> dsv = load_floats<V>(dsum + row * C + c);
        for (int k = 0; k < V; ++k) out.v[k] = rounded_to<T>(out.v[k]) + dsv.v[k];
      }
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
cudaError_t launch_forward(const T* x, const T* residual, const float* weight, const float* bias, T* sum_out, T* y,
                           float* mean, float* rstd, int64_t rows, int C, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(forward_blocks(rows)), block(kWarpsPerBlock * kWarpSize);
  const bool vec4 =
      C % 4 == 0 && aligned_vec4(x, weight, bias, y) && (residual == nullptr || aligned_vec4(residual, sum_out));
  return launch_kernel(vec4 ? layernorm_forward_kernel<4, T> : layernorm_forward_kernel<1, T>, grid, block, 0, stream,
                       x, residual, weight, bias, sum_out, y, mean, rstd, rows, C, eps);
}

template <class T>
cudaError_t launch_backward(const T* dy, const T* x, const float* weight, const float* mean, const float* rstd,
                            const T* dsum, T* dx, float* dweight, float* dbias, float* scratch, int64_t rows, int C,
                            cudaStream_t stream) {
  const unsigned blocks = backward_blocks(rows);
  const dim3 block(kWarpsPerBlock * kWarpSize);
  const bool vec4 = C % 4 == 0 && aligned_vec4(dy, x, weight, dx, scratch) && (dsum == nullptr || aligned_vec4(dsum));
  auto* kernel = dsum ? (vec4 ? layernorm_backward_kernel<4, T, true> : layernorm_backward_kernel<1, T, true>)
                      : (vec4 ? layernorm_backward_kernel<4, T, false> : layernorm_backward_kernel<1, T, false>);
  const cudaError_t launched =
      launch_kernel(kernel, dim3(blocks), block, 0, stream, dy, x, weight, mean, rstd, dsum, dx, scratch, rows, C);
  if (launched != cudaSuccess) return launched;
  return sum_partials(scratch, int64_t(blocks) * kWarpsPerBlock, C, dweight, dbias, 2, stream);
}

}  // namespace

size_t layernorm_backward_scratch_floats(int64_t rows, int C) {
  return static_cast<size_t>(2 * backward_blocks(rows) * kWarpsPerBlock) * static_cast<size_t>(C);
}

#define MINIDL_LAYERNORM_LAUNCHERS(T)                                                                                \
  cudaError_t layernorm_forward(const T* x, const float* weight, const float* bias, T* y, float* mean, float* rstd,  \
                                int64_t rows, int C, float eps, cudaStream_t stream) {                               \
    return launch_forward<T>(x, nullptr, weight, bias, nullptr, y, mean, rstd, rows, C, eps, stream);                \
  }                                                                                                                  \
  cudaError_t add_layernorm_forward(const T* a, const T* b, const float* weight, const float* bias, T* sum, T* y,    \
                                    float* mean, float* rstd, int64_t rows, int C, float eps, cudaStream_t stream) { \
    return launch_forward<T>(a, b, weight, bias, sum, y, mean, rstd, rows, C, eps, stream);                          \
  }                                                                                                                  \
  cudaError_t layernorm_backward(const T* dy, const T* x, const float* weight, const float* mean, const float* rstd, \
                                 T* dx, float* dweight, float* dbias, float* scratch, int64_t rows, int C,           \
                                 cudaStream_t stream) {                                                              \
    return launch_backward<T>(dy, x, weight, mean, rstd, nullptr, dx, dweight, dbias, scratch, rows, C, stream);     \
  }                                                                                                                  \
  cudaError_t add_layernorm_backward(const T* dy, const T* sum, const float* weight, const float* mean,              \
                                     const float* rstd, const T* dsum, T* dx, float* dweight, float* dbias,          \
                                     float* scratch, int64_t rows, int C, cudaStream_t stream) {                     \
    return launch_backward<T>(dy, sum, weight, mean, rstd, dsum, dx, dweight, dbias, scratch, rows, C, stream);      \
  }
MINIDL_LAYERNORM_LAUNCHERS(float)
MINIDL_LAYERNORM_LAUNCHERS(__half)
MINIDL_LAYERNORM_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_LAYERNORM_LAUNCHERS

}  // namespace minidl::ops::cuda
