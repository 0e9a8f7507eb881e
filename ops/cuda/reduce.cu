// Reductions on the GPU (ops/reduce.h and the sums behind ops::sum_to_shape; CPU reference ops/reduce.cpp).
//
// Everything is deterministic: no float atomics; partial results are combined in an order fixed by the shape.
//   - All elements: a grid-stride pass leaves one partial per block (a constant number of blocks for a given n),
//     and one block combines the partials in order.
//   - One dimension, x seen as (outer, n, inner): with inner == 1 each row of n is contiguous and one warp reduces
//     it (lanes at consecutive addresses, then a shuffle butterfly); with inner > 1 a block of 32 x 8 threads
//     takes 32 consecutive columns (coalesced reads along inner) and splits the n rows over its 8 thread rows;
//     when that leaves too few blocks to fill a GPU (a bias gradient: (B*T, C) -> (C)), the n rows are cut into
//     chunks whose partial sums a second kernel adds in order.
// max keeps the first maximum, and a NaN wins over any number (the first NaN), as the CPU's loop does.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/reduce.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int64_t kMaxAllBlocks = 1024;          // partials of the full reduction
constexpr int64_t kAllElemsPerThread = 4;        // below this, fewer blocks
constexpr int kTileRows = kThreads / kWarpSize;  // thread rows of the inner > 1 kernel's 32 x 8 block
constexpr int64_t kTargetBlocks = 512;           // chunk n until the inner > 1 grid has about this many blocks
constexpr int64_t kMinChunkRows = 64;            // ...but never below this many rows per chunk
constexpr int64_t kMaxChunks = 64;

__device__ __forceinline__ bool is_nan(float v) { return v != v; }

template <ReduceOp kOp>
__device__ __forceinline__ float identity() {
  return kOp == ReduceOp::kSum ? 0.0f : -INFINITY;
}

// Commutative, so every lane of a butterfly ends with the same bits.
template <ReduceOp kOp>
__device__ __forceinline__ float combine(float a, float b) {
  if constexpr (kOp == ReduceOp::kSum)
    return a + b;
  else
    return (is_nan(a) || a > b) ? a : b;
}

template <ReduceOp kOp>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = combine<kOp>(v, __shfl_xor_sync(kFullWarp, v, offset));
  return v;
}

// (value, position) of a max: the larger value, or a NaN, or on a tie the earlier position, so the result does
// not depend on which thread saw which element.
__device__ __forceinline__ void combine_arg(float& v, int64_t& i, float ov, int64_t oi) {
  const bool take = is_nan(ov) ? (!is_nan(v) || oi < i) : (!is_nan(v) && (ov > v || (ov == v && oi < i)));
  if (take) v = ov, i = oi;
}

// The block's result in thread 0 (every thread of the block must call it, once per kernel).
template <ReduceOp kOp>
__device__ float block_reduce(float v) {
  MINIDL_SHARED(float, warp_results, [kWarps]);
  v = warp_reduce<kOp>(v);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  return warp_reduce<kOp>(lane < kWarps ? warp_results[lane] : identity<kOp>());
}

// Pass 1 of a full reduction: partials[blockIdx.x] = the block's grid-stride share of x.
template <ReduceOp kOp>
__global__ void __launch_bounds__(kThreads) reduce_all_kernel(const float* x, int64_t n, float* partials) {
  float v = identity<kOp>();
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) v = combine<kOp>(v, x[i]);
  v = block_reduce<kOp>(v);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// Pass 2: one block combines the `parts` partials (each thread a fixed strided subset, then the block).
template <ReduceOp kOp>
__global__ void __launch_bounds__(kThreads)
    reduce_partials_kernel(const float* partials, int64_t parts, float scale, float* out) {
  float v = identity<kOp>();
  for (int64_t i = threadIdx.x; i < parts; i += kThreads) v = combine<kOp>(v, partials[i]);
  v = block_reduce<kOp>(v);
  if (threadIdx.x == 0) *out = kOp == ReduceOp::kSum ? v * scale : v;
}

// inner == 1: one warp per row of n contiguous elements.
template <ReduceOp kOp>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(const float* x, int64_t rows, int64_t n, float scale, float* out, int64_t* indices) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together; no block barrier here
  const float* xr = x + row * n;
  if constexpr (kOp == ReduceOp::kSum) {
    float sum = 0.0f;
    for (int64_t j = lane; j < n; j += kWarpSize) sum += xr[j];
    sum = warp_sum(sum);
    if (lane == 0) out[row] = sum * scale;
  } else {
    float best = -INFINITY;
    int64_t arg = n;  // loses every tie: no lane without elements wins
    for (int64_t j = lane; j < n; j += kWarpSize) combine_arg(best, arg, xr[j], j);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float ov = __shfl_xor_sync(kFullWarp, best, offset);
      const int64_t oi = __shfl_xor_sync(kFullWarp, static_cast<long long>(arg), offset);
      combine_arg(best, arg, ov, oi);
    }
    if (lane == 0) {
      out[row] = best;
      indices[row] = arg < n ? arg : 0;  // a row of -inf only: its first element
    }
  }
}

// inner > 1: block (32, 8) over 32 consecutive columns of one outer index and one chunk of rows. With one chunk
// the result goes to out/indices, otherwise the chunk's sum to partials[chunk][outer * inner].
template <ReduceOp kOp>
__global__ void __launch_bounds__(kThreads)
    reduce_columns_kernel(const float* x, int64_t outer, int64_t n, int64_t inner, int64_t chunk_rows, float scale,
                          float* out, int64_t* indices, float* partials) {
  MINIDL_SHARED(float, values, [kTileRows][kWarpSize]);
  MINIDL_SHARED(int64_t, positions, [kTileRows][kWarpSize]);
  const int64_t tiles = (inner + kWarpSize - 1) / kWarpSize;
  const int64_t o = blockIdx.x / tiles, i = (blockIdx.x % tiles) * kWarpSize + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk_rows, end = begin + chunk_rows < n ? begin + chunk_rows : n;
  float v = identity<kOp>();
  int64_t arg = n;
  if (i < inner) {
    const float* column = x + o * n * inner + i;
    for (int64_t j = begin + threadIdx.y; j < end; j += kTileRows) {
      if constexpr (kOp == ReduceOp::kSum)
        v += column[j * inner];
      else
        combine_arg(v, arg, column[j * inner], j);
    }
  }
  values[threadIdx.y][threadIdx.x] = v;
  positions[threadIdx.y][threadIdx.x] = arg;
  __syncthreads();
  if (threadIdx.y != 0 || i >= inner) return;  // after the block's only barrier
  for (int y = 1; y < kTileRows; ++y) {
    if constexpr (kOp == ReduceOp::kSum)
      v += values[y][threadIdx.x];
    else
      combine_arg(v, arg, values[y][threadIdx.x], positions[y][threadIdx.x]);
  }
  const int64_t k = o * inner + i;
  if (gridDim.y > 1) {
    partials[blockIdx.y * outer * inner + k] = v;
  } else if constexpr (kOp == ReduceOp::kSum) {
    out[k] = v * scale;
  } else {
    out[k] = v;
    indices[k] = arg < n ? arg : 0;
  }
}

// out[k] = scale * sum over chunks of partials[chunk][k], in chunk order.
__global__ void __launch_bounds__(kThreads)
    sum_chunks_kernel(const float* partials, int64_t chunks, int64_t outputs, float scale, float* out) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < outputs; k += stride) {
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) sum += partials[c * outputs + k];
    out[k] = sum * scale;
  }
}

// One thread per (outer, inner) position writes its whole column of n: the gradient at the saved index, zeros
// elsewhere. Consecutive threads write consecutive inner positions (coalesced when inner > 1), and the index is
// read once, not once per element.
__global__ void __launch_bounds__(kThreads)
    max_backward_kernel(const float* grad, const int64_t* indices, float* dx, int64_t outer, int64_t n, int64_t inner) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < outer * inner; k += stride) {
    const int64_t o = k / inner, i = k - o * inner, arg = indices[k];
    const float g = grad[k];
    float* column = dx + o * n * inner + i;
    for (int64_t j = 0; j < n; ++j) column[j * inner] = j == arg ? g : 0.0f;
  }
}

int64_t all_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads * kAllElemsPerThread - 1) / (kThreads * kAllElemsPerThread);
  return blocks < 1 ? 1 : blocks > kMaxAllBlocks ? kMaxAllBlocks : blocks;
}

int64_t column_chunks(ReduceOp op, int64_t outer, int64_t n, int64_t inner) {
  if (op == ReduceOp::kMax || inner == 1) return 1;
  const int64_t blocks = outer * ((inner + kWarpSize - 1) / kWarpSize);
  int64_t chunks = (kTargetBlocks + blocks - 1) / blocks;
  const int64_t by_rows = (n + kMinChunkRows - 1) / kMinChunkRows;
  chunks = chunks < by_rows ? chunks : by_rows;
  return chunks < 1 ? 1 : chunks > kMaxChunks ? kMaxChunks : chunks;
}

template <ReduceOp kOp>
cudaError_t launch_all(const float* x, int64_t n, float scale, float* out, float* scratch, cudaStream_t stream) {
  const int64_t blocks = all_blocks(n);
  const cudaError_t launched =
      launch_kernel(reduce_all_kernel<kOp>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, x, n, scratch);
  if (launched != cudaSuccess) return launched;
  return launch_kernel(reduce_partials_kernel<kOp>, dim3(1), dim3(kThreads), 0, stream, scratch, blocks, scale, out);
}

template <ReduceOp kOp>
cudaError_t launch_dim(const float* x, int64_t outer, int64_t n, int64_t inner, float scale, float* out,
                       int64_t* indices, float* scratch, cudaStream_t stream) {
  if (inner == 1) {
    const unsigned blocks = unsigned((outer + kWarps - 1) / kWarps);
    return launch_kernel(reduce_rows_kernel<kOp>, dim3(blocks), dim3(kThreads), 0, stream, x, outer, n, scale, out,
                         indices);
  }
  const int64_t chunks = column_chunks(kOp, outer, n, inner);
  const int64_t chunk_rows = (n + chunks - 1) / chunks;
  const dim3 grid(unsigned(outer * ((inner + kWarpSize - 1) / kWarpSize)), unsigned(chunks));
  const cudaError_t launched = launch_kernel(reduce_columns_kernel<kOp>, grid, dim3(kWarpSize, kTileRows), 0, stream, x,
                                             outer, n, inner, chunk_rows, scale, out, indices, scratch);
  if (launched != cudaSuccess || chunks == 1) return launched;
  return launch_kernel(sum_chunks_kernel, dim3(grid_stride_blocks(outer * inner, kThreads)), dim3(kThreads), 0, stream,
                       scratch, chunks, outer * inner, scale, out);
}

}  // namespace

size_t reduce_all_scratch_floats(int64_t n) { return static_cast<size_t>(all_blocks(n)); }

cudaError_t reduce_all(ReduceOp op, const float* x, int64_t n, float scale, float* out, float* scratch,
                       cudaStream_t stream) {
  return op == ReduceOp::kSum ? launch_all<ReduceOp::kSum>(x, n, scale, out, scratch, stream)
                              : launch_all<ReduceOp::kMax>(x, n, scale, out, scratch, stream);
}

size_t reduce_dim_scratch_floats(ReduceOp op, int64_t outer, int64_t n, int64_t inner) {
  const int64_t chunks = column_chunks(op, outer, n, inner);
  return chunks > 1 ? static_cast<size_t>(chunks * outer * inner) : 0;
}

cudaError_t reduce_dim(ReduceOp op, const float* x, int64_t outer, int64_t n, int64_t inner, float scale, float* out,
                       int64_t* indices, float* scratch, cudaStream_t stream) {
  if (outer * inner == 0) return cudaSuccess;
  return op == ReduceOp::kSum ? launch_dim<ReduceOp::kSum>(x, outer, n, inner, scale, out, indices, scratch, stream)
                              : launch_dim<ReduceOp::kMax>(x, outer, n, inner, scale, out, indices, scratch, stream);
}

cudaError_t max_backward(const float* grad, const int64_t* indices, float* dx, int64_t outer, int64_t n, int64_t inner,
                         cudaStream_t stream) {
  if (outer * n * inner == 0) return cudaSuccess;
  return launch_kernel(max_backward_kernel, dim3(grid_stride_blocks(outer * inner, kThreads)), dim3(kThreads), 0,
                       stream, grad, indices, dx, outer, n, inner);
}

}  // namespace minidl::ops::cuda
