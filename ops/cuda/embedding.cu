// Embedding forward (gather) and backward (scatter-add) on the GPU (ops/embedding.h; CPU reference
// ops/cpu/embedding.cpp).
//
// Backward has two strategies:
//   - deterministic (default): the CPU's own scheme, sort-free. Block (r, c) owns kVocabRowsPerBlock vocabulary
//     rows and kThreads columns of dweight; it streams all ids through shared memory and, for each position whose
//     id falls in its rows, each thread adds that position's gradient to its own column. Every element of dweight
//     has exactly one writer and receives its positions in increasing order: the same bits as the CPU op, on
//     every run. Cost: each block reads all n ids (n * V / kVocabRowsPerBlock id reads in all, a few MB for GPT-2)
//     and a block whose rows hold frequent tokens does more of the adds. A sort (per-id segments) would balance
//     that better but needs a radix sort, i.e. cub, which this directory avoids (see CMakeLists.txt).
//   - atomic: one warp per position adds its row with float atomicAdd. Faster for skewed ids, but the order of
//     the adds to a row (and so its last bits) changes from run to run.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/embedding.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kVocabRowsPerBlock = 64;
constexpr int kIdsPerTile = 1024;

// One warp per position: the row of C floats is copied by 32 lanes at consecutive addresses, as 128-bit vectors
// when V = 4 (C % 4 == 0, pointers aligned).
template <int V>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(const float* weight, const int64_t* ids, float* out, int64_t n, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t pos = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (pos >= n) return;  // whole warps leave; no barrier in this kernel
  const float* src = weight + ids[pos] * C;
  float* dst = out + pos * C;
  for (int c = lane * V; c < C; c += kWarpSize * V) store_vec<V>(dst + c, load_vec<V>(src + c));
}

// Deterministic backward; grid (ceil(vocab / kVocabRowsPerBlock), ceil(C / kThreads)). dweight is overwritten.
__global__ void __launch_bounds__(kThreads)
    embedding_backward_ordered_kernel(const float* grad_out, const int64_t* ids, float* dweight, int64_t n,
                                      int64_t vocab, int C) {
  MINIDL_SHARED(int64_t, tile, [kIdsPerTile]);
  const int64_t v0 = int64_t(blockIdx.x) * kVocabRowsPerBlock;
  const int64_t v1 = v0 + kVocabRowsPerBlock < vocab ? v0 + kVocabRowsPerBlock : vocab;
  const int c = int(blockIdx.y) * kThreads + int(threadIdx.x);
  const bool owns_column = c < C;
  if (owns_column)
    for (int64_t v = v0; v < v1; ++v) dweight[v * C + c] = 0.0f;
  for (int64_t first = 0; first < n; first += kIdsPerTile) {
    const int64_t count = n - first < kIdsPerTile ? n - first : kIdsPerTile;
    for (int64_t k = threadIdx.x; k < count; k += kThreads) tile[k] = ids[first + k];
    __syncthreads();
    if (owns_column)
      for (int64_t k = 0; k < count; ++k) {
        const int64_t v = tile[k];  // the same for every thread: no divergence
        if (v >= v0 && v < v1) dweight[v * C + c] += grad_out[(first + k) * C + c];
      }
    __syncthreads();  // the tile is overwritten next
  }
}

// Atomic backward: one warp per position; dweight must be zero beforehand.
__global__ void __launch_bounds__(kThreads)
    embedding_backward_atomic_kernel(const float* grad_out, const int64_t* ids, float* dweight, int64_t n, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t pos = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (pos >= n) return;
  float* dst = dweight + ids[pos] * C;
  const float* src = grad_out + pos * C;
  for (int c = lane; c < C; c += kWarpSize) atomicAdd(dst + c, src[c]);
}

unsigned position_blocks(int64_t n) { return unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

cudaError_t embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t n, int C,
                              cudaStream_t stream) {
  if (n == 0 || C == 0) return cudaSuccess;
  const dim3 grid(position_blocks(n)), block(kThreads);
  if (C % 4 == 0 && aligned16(weight, out))
    return launch_kernel(embedding_forward_kernel<4>, grid, block, 0, stream, weight, ids, out, n, C);
  return launch_kernel(embedding_forward_kernel<1>, grid, block, 0, stream, weight, ids, out, n, C);
}

cudaError_t embedding_backward(const float* grad_out, const int64_t* ids, float* dweight, int64_t n, int64_t vocab,
                               int C, bool deterministic, cudaStream_t stream) {
  if (vocab == 0 || C == 0) return cudaSuccess;
  if (deterministic) {
    const dim3 grid(unsigned((vocab + kVocabRowsPerBlock - 1) / kVocabRowsPerBlock),
                    unsigned((C + kThreads - 1) / kThreads));
    return launch_kernel(embedding_backward_ordered_kernel, grid, dim3(kThreads), 0, stream, grad_out, ids, dweight, n,
                         vocab, C);
  }
  const cudaError_t zeroed = cudaMemsetAsync(dweight, 0, size_t(vocab) * size_t(C) * sizeof(float), stream);
  if (zeroed != cudaSuccess || n == 0) return zeroed;
  return launch_kernel(embedding_backward_atomic_kernel, dim3(position_blocks(n)), dim3(kThreads), 0, stream, grad_out,
                       ids, dweight, n, C);
}

}  // namespace minidl::ops::cuda
