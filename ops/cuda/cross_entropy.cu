// Fused softmax + cross-entropy forward and backward on the GPU (ops/cross_entropy.h; CPU reference
// ops/cpu/cross_entropy.cpp). The (N, V) probabilities are never stored.
//
// One block per row: GPT's V = 50257 is far too long for a warp, and a block reads its row with consecutive
// threads at consecutive addresses (128-bit vectors when V % 4 == 0 and the row is aligned). Each thread keeps an
// online softmax (kernels::OnlineSoftmax: running max and sum) over its strided part of the row, so the row is read
// once; the (max, sum) pairs are then merged by warp shuffles and across warps through shared memory, in a fixed
// order. The mean over counted rows is a second, single-block kernel that adds the per-row losses in a fixed
// order: no float atomics, the same bits on every run and every GPU.
#include <cmath>

#include "ops/cuda/device_utils.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/kernels/softmax.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

using Online = kernels::OnlineSoftmax<float>;

// a := a merged with b (both partial softmaxes of disjoint parts of one row).
__device__ __forceinline__ void merge(Online& a, const Online& b) {
  a.rescale_for(b.max);
  // b.max == a.max also covers two empty parts (both -inf), whose sums are 0.
  a.sum += b.max == a.max ? b.sum : b.sum * expf(b.max - a.max);
}

// Forward: lse[row], and row_loss[row] = lse - logit[target] (0 for an ignored row).
template <int V>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const float* logits, const int64_t* targets, float* lse, float* row_loss,
                                 int64_t classes, int64_t ignore_index) {
  MINIDL_SHARED(float, warp_maxes, [kWarps]);
  MINIDL_SHARED(float, warp_sums, [kWarps]);
  const int64_t row = blockIdx.x;
  const float* xr = logits + row * classes;
  Online acc{-INFINITY, 0.0f};
  for (int64_t j = int64_t(threadIdx.x) * V; j < classes; j += int64_t(kThreads) * V) {
    const FloatVec<V> xv = load_vec<V>(xr + j);
    float block_max = xv.v[0];
    for (int k = 1; k < V; ++k) block_max = fmaxf(block_max, xv.v[k]);
    if (block_max == -INFINITY) continue;  // only masked logits: they add exp(-inf) = 0
    acc.rescale_for(block_max);
    for (int k = 0; k < V; ++k) acc.sum += expf(xv.v[k] - acc.max);
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const Online other{__shfl_xor_sync(kFullWarp, acc.max, offset), __shfl_xor_sync(kFullWarp, acc.sum, offset)};
    merge(acc, other);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) {
    warp_maxes[warp] = acc.max;
    warp_sums[warp] = acc.sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Online total{warp_maxes[0], warp_sums[0]};
    for (int w = 1; w < kWarps; ++w) merge(total, Online{warp_maxes[w], warp_sums[w]});
    const float l = total.logsumexp();
    const int64_t target = targets[row];
    lse[row] = l;
    row_loss[row] = target == ignore_index ? 0.0f : l - xr[target];
  }
}

// loss = sum of row_loss (divided by the count of non-ignored rows for the mean), count written too. One block:
// each thread adds a fixed strided set of rows in f64 (as the CPU does; N is a few thousand, so f64's cost does
// not matter), then a fixed tree over the threads.
__global__ void __launch_bounds__(kThreads)
    cross_entropy_loss_kernel(const float* row_loss, const int64_t* targets, int64_t rows, int64_t ignore_index,
                              bool mean, float* loss, int64_t* count) {
  MINIDL_SHARED(double, sums, [kThreads]);
  MINIDL_SHARED(long long, counts, [kThreads]);
  double sum = 0.0;
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    sum += row_loss[r];
    counted += targets[r] != ignore_index;
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = counted;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride) {
      sums[threadIdx.x] += sums[threadIdx.x + stride];
      counts[threadIdx.x] += counts[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = float(mean ? sums[0] / double(counts[0]) : sums[0]);
    *count = counts[0];
  }
}

// Backward: dlogits = (exp(x - lse) - onehot) * scale, scale = dloss / divisor, zeros for an ignored row.
template <int V>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const float* dloss, const float* logits, const int64_t* targets,
                                  const float* lse, const int64_t* divisor, float* dlogits, int64_t classes,
                                  int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  const bool ignored = target == ignore_index;
  // Rounded like the CPU: the quotient in f64, then to f32.
  const float scale = float(double(*dloss) / double(divisor ? *divisor : 1));
  const float l = lse[row];
  const float* xr = logits + row * classes;
  float* dr = dlogits + row * classes;
  for (int64_t j = int64_t(threadIdx.x) * V; j < classes; j += int64_t(kThreads) * V) {
    FloatVec<V> out = load_vec<V>(xr + j);
    for (int k = 0; k < V; ++k) {
      out.v[k] = ignored ? 0.0f : expf(out.v[k] - l) * scale;
      if (j + k == target) out.v[k] -= scale;
    }
    store_vec<V>(dr + j, out);
  }
}

}  // namespace

cudaError_t cross_entropy_forward(const float* logits, const int64_t* targets, float* lse, float* row_loss,
                                  float* loss, int64_t* count, int64_t rows, int64_t classes, int64_t ignore_index,
                                  bool mean, cudaStream_t stream) {
  if (rows > 0) {
    const cudaError_t launched =
        classes % 4 == 0 && aligned16(logits)
            ? launch_kernel(cross_entropy_forward_kernel<4>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits,
                            targets, lse, row_loss, classes, ignore_index)
            : launch_kernel(cross_entropy_forward_kernel<1>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits,
                            targets, lse, row_loss, classes, ignore_index);
    if (launched != cudaSuccess) return launched;
  }
  return launch_kernel(cross_entropy_loss_kernel, dim3(1), dim3(kThreads), 0, stream, row_loss, targets, rows,
                       ignore_index, mean, loss, count);
}

cudaError_t cross_entropy_backward(const float* dloss, const float* logits, const int64_t* targets,
                                   const float* lse, const int64_t* divisor, float* dlogits, int64_t rows,
                                   int64_t classes, int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (classes % 4 == 0 && aligned16(logits, dlogits))
    return launch_kernel(cross_entropy_backward_kernel<4>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, dloss,
                         logits, targets, lse, divisor, dlogits, classes, ignore_index);
  return launch_kernel(cross_entropy_backward_kernel<1>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, dloss,
                       logits, targets, lse, divisor, dlogits, classes, ignore_index);
}

}  // namespace minidl::ops::cuda
