// Test kernels for the CUDA emulator, written as shared kernel code must be: one portability header,
// launch_kernel instead of <<<>>>, dynamic_smem<T>() instead of extern __shared__, MINIDL_SHARED instead of
// __shared__ arrays. Built by g++ against the
// emulator (test_cuda_emu) and by nvcc for sm_80 and sm_90 (cuda_emu_nvcc_check).
#include "kernels.h"

#include <math.h>

namespace emu_test {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// The lanes of the caller's warp that exist in a 1-D block (the last warp may be partial).
__device__ unsigned warp_lanes() {
  const unsigned first = threadIdx.x / 32 * 32, count = min(32u, blockDim.x - first);
  return count == 32 ? kFull : (1u << count) - 1;
}

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}
__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, offset));
  return v;
}

// Block-wide reduction for blocks of whole warps; `scratch` holds one float per warp.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
    v = kMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

__global__ void block_sum_kernel(const float* in, int n, float* out) {
  MINIDL_SHARED(float, partial, [1024]);
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  partial[t] = i < n ? in[i] : 0.0f;
  __syncthreads();
  int half = 1;
  while (half * 2 < static_cast<int>(blockDim.x)) half *= 2;
  for (; half > 0; half /= 2) {
    if (t < half && t + half < static_cast<int>(blockDim.x)) partial[t] += partial[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void warp_sum_kernel(const float* in, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  const unsigned lanes = warp_lanes();
  float v = i < n ? in[i] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(lanes, v, offset);
    if (lane + offset < 32 && (lanes >> (lane + offset) & 1)) v += other;  // past the warp's end: nothing
  }
  const int warps_per_block = (blockDim.x + 31) / 32;
  if (lane == 0) out[blockIdx.x * warps_per_block + threadIdx.x / 32] = v;
}

__global__ void segment_sum_kernel(const int* in, int* out, int width) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = in[i];
  for (int m = width / 2; m > 0; m /= 2) v += __shfl_xor_sync(kFull, v, m, width);
  out[i] = v;
}

__global__ void warp_scan_kernel(const int* in, int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  int v = i < n ? in[i] : 0;
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(warp_lanes(), v, d);
    if (lane >= d) v += up;
  }
  if (i < n) out[i] = v;
}

__global__ void shuffle_half_warp_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x;
  if (lane < 16) out[lane] = __shfl_sync(0x0000ffffu, lane * 10u, lane == 3 ? 20 : static_cast<int>(lane ^ 1u));
}

__global__ void vote_kernel(int* out) {
  const int lane = threadIdx.x;
  if (lane % 2 != 0) return;  // odd lanes take no part: every mask below names even lanes only
  const unsigned even = 0x55555555u;
  out[4 * lane + 0] = static_cast<int>(__ballot_sync(even, lane % 4 == 0));
  out[4 * lane + 1] = __any_sync(even, lane == 6);
  out[4 * lane + 2] = __all_sync(even, lane % 2 == 0);
  out[4 * lane + 3] = __all_sync(even, lane != 8);
}

__global__ void wide_shuffle_kernel(double* d, long long* ll, __half* h, __nv_bfloat16* b) {
  const int lane = threadIdx.x;
  d[lane] = __shfl_xor_sync(kFull, d[lane], 1);
  ll[lane] = __shfl_down_sync(kFull, ll[lane], 1);
  h[lane] = __shfl_sync(kFull, h[lane], 0);
  b[lane] = __shfl_up_sync(kFull, b[lane], 2);
}

__global__ void barrier_vote_kernel(int* out) {
  const int t = threadIdx.x, n = blockDim.x;
  const int count = __syncthreads_count(t % 3 == 0);
  const int all = __syncthreads_and(t < n);
  const int any = __syncthreads_or(t == n - 1);
  const int not_all = __syncthreads_and(t != 5);
  if (t == 0) out[0] = count, out[1] = all, out[2] = any, out[3] = not_all;
}

__global__ void atomics_kernel(AtomicResults* r) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&r->count, 1);
  atomicAdd(&r->big, 1ull << 33);
  atomicMax(&r->max, i * 7919 % 10007);
  atomicMin(&r->min, i * 7919 % 10007 - 5000);
  atomicAdd(&r->fsum, 0.1f * static_cast<float>(i % 10));
  atomicAdd(&r->dsum, 0.5 * (i % 4));
  int seen = atomicAdd(&r->cas, 0);
  for (int assumed = seen - 1; seen != assumed;) {
    assumed = seen;
    seen = atomicCAS(&r->cas, assumed, assumed + 1);
  }
  if (atomicExch(&r->flag, 1u) == 0u) atomicAdd(&r->exch_hits, 1u);
}

__global__ void reverse_kernel(const float* in, float* out, int n) {
  float* slice = dynamic_smem<float>();
  const int t = threadIdx.x, base = blockIdx.x * blockDim.x, len = min(static_cast<int>(blockDim.x), n - base);
  if (t < len) slice[t] = in[base + t];
  __syncthreads();
  if (t < len) out[base + t] = slice[len - 1 - t];
}

__global__ void read_unwritten_kernel(unsigned* out) { out[threadIdx.x] = dynamic_smem<unsigned>()[threadIdx.x]; }

// Block 0 fills the static array; every block then copies it out.
__global__ void read_unwritten_static_kernel(unsigned* out) {
  MINIDL_SHARED(unsigned, slots, [64]);
  if (blockIdx.x == 0) slots[threadIdx.x] = 7u + threadIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = slots[threadIdx.x];
}

__global__ void index_2d_kernel(int* out, int width, int height) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) out[y * width + x] = x << 16 | y;
}

__global__ void index_3d_kernel(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}

__global__ void softmax_kernel(const float* in, float* out, int cols) {
  MINIDL_SHARED(float, scratch, [32]);
  const float* x = in + static_cast<size_t>(blockIdx.x) * cols;
  float* y = out + static_cast<size_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[c]);
  m = block_reduce<true>(m, scratch);
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(x[c] - m);
  const float inv = 1.0f / block_reduce<false>(s, scratch);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] = __expf(x[c] - m) * inv;
}

__global__ void empty_kernel() {}

// ---- planted bugs: the tests look these markers up to know which lines the reports must name ----
__global__ void shift_right_kernel(const float* in, float* out, int n, bool with_barrier) {
  float* s = dynamic_smem<float>();
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0.0f;
  if (with_barrier) __syncthreads();  // planted: without it, thread t may read s[t - 1] before it is written
  if (i < n) out[i] = t > 0 ? s[t - 1] : 0.0f;
}

__global__ void shift_right_static_kernel(const float* in, float* out, int n, bool with_barrier) {
  MINIDL_SHARED(float, s, [256]);
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0.0f;
  if (with_barrier) __syncthreads();  // planted: without it, thread t may read s[t - 1] before it is written
  if (i < n) out[i] = t > 0 ? s[t - 1] : 0.0f;
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    out[threadIdx.x] = 1.0f;
    __syncthreads();  // planted:divergent-low
  } else {
    __syncthreads();  // planted:divergent-high
    out[threadIdx.x] = 2.0f;
  }
}

__global__ void barrier_after_return_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = 1.0f;
  __syncthreads();  // planted:after-return
}

__global__ void shuffle_against_barrier_kernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 16)
    v = __shfl_sync(kFull, v, 31);  // planted:shuffle
  else
    __syncthreads();  // planted:barrier
  out[threadIdx.x] = v;
}

int blocks_for(int n, int threads) { return (n + threads - 1) / threads; }

}  // namespace

cudaError_t block_sums(const float* in, int n, float* out, int threads) {
  return launch_kernel(block_sum_kernel, blocks_for(n, threads), threads, 0, nullptr, in, n, out);
}
cudaError_t warp_sums(const float* in, int n, float* out, int threads) {
  return launch_kernel(warp_sum_kernel, blocks_for(n, threads), threads, 0, nullptr, in, n, out);
}
cudaError_t segment_sums(const int* in, int* out, int n, int width) {
  return launch_kernel(segment_sum_kernel, n / 64, 64, 0, nullptr, in, out, width);
}
cudaError_t warp_scans(const int* in, int* out, int n, int threads) {
  return launch_kernel(warp_scan_kernel, blocks_for(n, threads), threads, 0, nullptr, in, out, n);
}
cudaError_t shuffle_half_warp(unsigned* out) { return launch_kernel(shuffle_half_warp_kernel, 1, 32, 0, nullptr, out); }
cudaError_t vote_even_lanes(int* out) { return launch_kernel(vote_kernel, 1, 32, 0, nullptr, out); }
cudaError_t wide_shuffles(double* d, long long* ll, __half* h, __nv_bfloat16* b) {
  return launch_kernel(wide_shuffle_kernel, 1, 32, 0, nullptr, d, ll, h, b);
}
cudaError_t barrier_votes(int threads, int* out) {
  return launch_kernel(barrier_vote_kernel, 1, threads, 0, nullptr, out);
}
cudaError_t atomics(int blocks, int threads, AtomicResults* results) {
  return launch_kernel(atomics_kernel, blocks, threads, 0, nullptr, results);
}
cudaError_t reverse_blocks(const float* in, float* out, int n, int threads) {
  return launch_kernel(reverse_kernel, blocks_for(n, threads), threads, threads * sizeof(float), nullptr, in, out, n);
}
cudaError_t read_unwritten_smem(unsigned* out, int threads) {
  return launch_kernel(read_unwritten_kernel, 1, threads, threads * sizeof(unsigned), nullptr, out);
}
cudaError_t read_unwritten_static_smem(unsigned* out, int blocks) {
  return launch_kernel(read_unwritten_static_kernel, blocks, 64, 0, nullptr, out);
}
cudaError_t index_2d(int* out, int width, int height, dim3 block) {
  const dim3 grid(blocks_for(width, block.x), blocks_for(height, block.y));
  return launch_kernel(index_2d_kernel, grid, block, 0, nullptr, out, width, height);
}
cudaError_t index_3d(int* out) { return launch_kernel(index_3d_kernel, dim3(2, 2, 2), dim3(4, 3, 2), 0, nullptr, out); }
cudaError_t softmax_rows(const float* in, float* out, int rows, int cols, int threads) {
  return launch_kernel(softmax_kernel, rows, threads, 0, nullptr, in, out, cols);
}
cudaError_t empty_launch(dim3 grid, dim3 block, size_t smem_bytes) {
  return launch_kernel(empty_kernel, grid, block, smem_bytes, nullptr);
}
cudaError_t allow_dynamic_smem(int bytes) {
  return cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

cudaError_t shift_right(const float* in, float* out, int n, int threads, bool with_barrier) {
  return launch_kernel(shift_right_kernel, blocks_for(n, threads), threads, threads * sizeof(float), nullptr, in, out,
                       n, with_barrier);
}
cudaError_t shift_right_static(const float* in, float* out, int n, int threads, bool with_barrier) {
  return launch_kernel(shift_right_static_kernel, blocks_for(n, threads), threads, 0, nullptr, in, out, n,
                       with_barrier);
}
cudaError_t divergent_barrier(float* out) { return launch_kernel(divergent_barrier_kernel, 1, 64, 0, nullptr, out); }
cudaError_t barrier_after_return(float* out) {
  return launch_kernel(barrier_after_return_kernel, 1, 64, 0, nullptr, out);
}
cudaError_t shuffle_against_barrier(float* out) {
  return launch_kernel(shuffle_against_barrier_kernel, 1, 32, 0, nullptr, out);
}

}  // namespace emu_test
