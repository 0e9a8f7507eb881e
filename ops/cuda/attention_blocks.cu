// Attention over blocks of a sequence on the GPU (ops/attention_blocks.h; CPU reference in ops/cpu/attention.cpp):
// what context parallelism's ring computes per block. Plain kernels, one thread per row, no shared memory: the
// ring's blocks are small and its cost is the exchange; the tensor-core flash kernels serve the whole sequence.
//
// Forward, a thread per query row (b, h, i): two passes over its keys (j <= i on the diagonal block), the row's max
// and sum of exps, then the normalised output accumulated in place; lse = max + log(sum). Backward, with the row's
// merged out and lse (P = exp(S - lse) is the row's true probability): a thread per query row writes delta =
// rowsum(dout * out) and dq = scale sum_j P (dout . v_j - delta) k_j; then a thread per key row (b, kv head, j)
// sums over the query heads of its group and the queries that see it: dv_j = sum P dout_i, dk_j = scale sum P
// (dout_i . v_j - delta_i) q_i. Every thread owns the rows it writes: no atomics, the same sums on every run.
#include "ops/cuda/attention_blocks.h"
#include "ops/cuda/device_utils.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 128;

// The shapes of one (query block, key block) pair, q (B, Tq, H D) against k and v (B, Tk, Hkv D), and where rows
// live in them.
struct Dims {
  int64_t B, Tq, Tk, H, Hkv, D;
  bool causal;
  __device__ int64_t q_at(int64_t b, int64_t i, int64_t h) const { return (b * Tq + i) * H * D + h * D; }
  __device__ int64_t kv_at(int64_t b, int64_t j, int64_t kvh) const { return (b * Tk + j) * Hkv * D + kvh * D; }
  __device__ int64_t stat_at(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * Tq + i; }  // lse, delta
  __device__ int64_t keys_of(int64_t i) const { return causal ? i + 1 : Tk; }  // the keys query i sees
  __device__ float scale() const { return 1.f / sqrtf(static_cast<float>(D)); }
};

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t D) {
  float s = 0.f;
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

__device__ __forceinline__ int64_t first_row() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t row_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void __launch_bounds__(kThreads)
    block_forward_kernel(const float* q, const float* k, const float* v, float* out, float* lse, Dims s) {
  for (int64_t r = first_row(); r < s.B * s.H * s.Tq; r += row_stride()) {
    const int64_t i = r % s.Tq, h = (r / s.Tq) % s.H, b = r / (s.Tq * s.H), kvh = h / (s.H / s.Hkv);
    const float* qi = q + s.q_at(b, i, h);
    float* oi = out + s.q_at(b, i, h);
    float mx = -INFINITY, sum = 0.f;
    for (int64_t j = 0; j < s.keys_of(i); ++j) mx = fmaxf(mx, s.scale() * dot(qi, k + s.kv_at(b, j, kvh), s.D));
    for (int64_t d = 0; d < s.D; ++d) oi[d] = 0.f;
    for (int64_t j = 0; j < s.keys_of(i); ++j) {
      const float p = expf(s.scale() * dot(qi, k + s.kv_at(b, j, kvh), s.D) - mx);
      sum += p;
      const float* vj = v + s.kv_at(b, j, kvh);
      for (int64_t d = 0; d < s.D; ++d) oi[d] += p * vj[d];
    }
    for (int64_t d = 0; d < s.D; ++d) oi[d] /= sum;
    lse[s.stat_at(b, h, i)] = mx + logf(sum);
  }
}

__global__ void __launch_bounds__(kThreads)
    block_backward_dq_kernel(const float* dout, const float* q, const float* k, const float* v, const float* out,
                             const float* lse, float* delta, float* dq, Dims s) {
  for (int64_t r = first_row(); r < s.B * s.H * s.Tq; r += row_stride()) {
    const int64_t i = r % s.Tq, h = (r / s.Tq) % s.H, b = r / (s.Tq * s.H), kvh = h / (s.H / s.Hkv);
    const int64_t at = s.q_at(b, i, h);
    const float l = lse[s.stat_at(b, h, i)], di = dot(dout + at, out + at, s.D);
    delta[s.stat_at(b, h, i)] = di;
    for (int64_t d = 0; d < s.D; ++d) dq[at + d] = 0.f;
    for (int64_t j = 0; j < s.keys_of(i); ++j) {
      const float *kj = k + s.kv_at(b, j, kvh), *vj = v + s.kv_at(b, j, kvh);
      const float p = expf(s.scale() * dot(q + at, kj, s.D) - l);
      const float ds = p * (dot(dout + at, vj, s.D) - di) * s.scale();
      for (int64_t d = 0; d < s.D; ++d) dq[at + d] += ds * kj[d];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    block_backward_dkv_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                              const float* delta, float* dk, float* dv, Dims s) {
  const int64_t group = s.H / s.Hkv;
  for (int64_t r = first_row(); r < s.B * s.Hkv * s.Tk; r += row_stride()) {
    const int64_t j = r % s.Tk, kvh = (r / s.Tk) % s.Hkv, b = r / (s.Tk * s.Hkv), at = s.kv_at(b, j, kvh);
    for (int64_t d = 0; d < s.D; ++d) dk[at + d] = dv[at + d] = 0.f;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
      for (int64_t i = s.causal ? j : 0; i < s.Tq; ++i) {
        const float *qi = q + s.q_at(b, i, h), *gi = dout + s.q_at(b, i, h);
        const float p = expf(s.scale() * dot(qi, k + at, s.D) - lse[s.stat_at(b, h, i)]);
        const float ds = p * (dot(gi, v + at, s.D) - delta[s.stat_at(b, h, i)]) * s.scale();
        for (int64_t d = 0; d < s.D; ++d) {
          dv[at + d] += p * gi[d];
          dk[at + d] += ds * qi[d];
        }
      }
  }
}

__global__ void __launch_bounds__(kThreads) merge_kernel(float* out, float* lse, const float* out_b, const float* lse_b,
                                                         int64_t B, int64_t T, int64_t H, int64_t D) {
  for (int64_t r = first_row(); r < B * H * T; r += row_stride()) {
    const int64_t t = r % T, h = (r / T) % H, b = r / (T * H);
    const float a = lse[r], c = lse_b[r];
    if (c == -INFINITY) continue;  // the block saw nothing of this row
    // w = sigmoid(c - a), the block's share of the row; the new lse is log(e^a + e^c) = max + log1p(e^-|a-c|).
    const float w = a == -INFINITY ? 1.f : 1.f / (1.f + expf(a - c));
    float* row = out + (b * T + t) * H * D + h * D;
    const float* rb = out_b + (b * T + t) * H * D + h * D;
    for (int64_t d = 0; d < D; ++d) row[d] = w == 1.f ? rb[d] : row[d] - w * (row[d] - rb[d]);
    lse[r] = fmaxf(a, c) + log1pf(expf(-fabsf(a - c)));
  }
}

}  // namespace

cudaError_t attention_block_forward(const float* q, const float* k, const float* v, float* out, float* lse, int64_t B,
                                    int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, bool causal,
                                    cudaStream_t stream) {
  const int64_t rows = B * H * Tq;
  if (rows == 0) return cudaSuccess;
  return launch_kernel(block_forward_kernel, dim3(grid_stride_blocks(rows, kThreads)), dim3(kThreads), 0, stream, q, k,
                       v, out, lse, Dims{B, Tq, Tk, H, Hkv, D, causal});
}

cudaError_t attention_block_backward(const float* dout, const float* q, const float* k, const float* v,
                                     const float* out, const float* lse, float* delta, float* dq, float* dk, float* dv,
                                     int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, bool causal,
                                     cudaStream_t stream) {
  if (B * H * Tq == 0) return cudaSuccess;
  cudaError_t e =
      launch_kernel(block_backward_dq_kernel, dim3(grid_stride_blocks(B * H * Tq, kThreads)), dim3(kThreads), 0, stream,
                    dout, q, k, v, out, lse, delta, dq, Dims{B, Tq, Tk, H, Hkv, D, causal});
  if (e != cudaSuccess) return e;
  return launch_kernel(block_backward_dkv_kernel, dim3(grid_stride_blocks(B * Hkv * Tk, kThreads)), dim3(kThreads), 0,
                       stream, dout, q, k, v, lse, delta, dk, dv, Dims{B, Tq, Tk, H, Hkv, D, causal});
}

cudaError_t merge_attention_blocks(float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t T,
                                   int64_t H, int64_t D, cudaStream_t stream) {
  const int64_t rows = B * H * T;
  if (rows == 0) return cudaSuccess;
  return launch_kernel(merge_kernel, dim3(grid_stride_blocks(rows, kThreads)), dim3(kThreads), 0, stream, out, lse,
                       out_b, lse_b, B, T, H, D);
}

}  // namespace minidl::ops::cuda
