// Fused softmax + cross-entropy forward and backward on the GPU (ops/cross_entropy.h; CPU reference
// ops/cpu/cross_entropy.cpp). The (N, V) probabilities are never stored.
//
// One block per row: GPT's V = 50257 is far too long for a warp, and a block reads its row with consecutive
// threads at consecutive addresses (16-byte vectors, 4 floats or 8 16-bit values, when the row stride allows it,
// then the last V % width columns one at a time). Each thread keeps an online softmax (kernels::OnlineSoftmax:
// running max and sum) over its strided part of the row, so the row is read once; the (max, sum) pairs are then
// merged by warp shuffles and across warps through shared memory, in a fixed order. The mean over counted rows is a
// second, single-block kernel that adds the per-row losses in a fixed order: no float atomics, the same bits on
// every run and every GPU.
//
// Logits are f32, f16 or bf16 (read as they are: no cast kernel around the classifier under autocast); the math,
// the lse and the loss are f32. Rows are `classes` (V) long and `stride` (Vp >= V, the padded vocabulary) apart:
// the padding columns are never read by the forward and get zero gradients. The backward may write dlogits over
// the logits (dlogits == logits): each thread reads its elements before writing the same elements.
#include <cmath>

#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/device_utils.h"
#include "ops/cuda/storage_vec.h"
#include "ops/kernels/softmax.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

using Online = kernels::OnlineSoftmax<float>;

// Elements per 16-byte access.
template <class T>
constexpr int kVecWidth = int(16 / sizeof(T));

// a := a merged with b (both partial softmaxes of disjoint parts of one row).
__device__ __forceinline__ void merge(Online& a, const Online& b) {
  a.rescale_for(b.max);
  // b.max == a.max also covers two empty parts (both -inf), whose sums are 0.
  a.sum += b.max == a.max ? b.sum : b.sum * expf(b.max - a.max);
}

// acc := acc with n more logits whose maximum is block_max.
template <int N>
__device__ __forceinline__ void add(Online& acc, const float (&x)[N]) {
  float block_max = x[0];
  for (int k = 1; k < N; ++k) block_max = fmaxf(block_max, x[k]);
  if (block_max == -INFINITY) return;  // only masked logits: they add exp(-inf) = 0
  acc.rescale_for(block_max);
  for (int k = 0; k < N; ++k) acc.sum += expf(x[k] - acc.max);
}

// Forward: lse[row], and row_loss[row] = lse - logit[target] (0 for an ignored row). N: elements per access (1, or
// kVecWidth<T> when the stride and the base pointer allow vectors).
template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const T* logits, const int64_t* targets, float* lse, float* row_loss, int64_t classes,
                                 int64_t stride, int64_t ignore_index) {
  MINIDL_SHARED(float, warp_maxes, [kWarps]);
  MINIDL_SHARED(float, warp_sums, [kWarps]);
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * stride;
  Online acc{-INFINITY, 0.0f};
  const int64_t vectors_end = classes / N * N;
  for (int64_t j = int64_t(threadIdx.x) * N; j < vectors_end; j += int64_t(kThreads) * N) {
    const StorageVec<T, N> xv = *reinterpret_cast<const StorageVec<T, N>*>(xr + j);
    float x[N];
    for (int k = 0; k < N; ++k) x[k] = to_float(xv.v[k]);
    add(acc, x);
  }
  for (int64_t j = vectors_end + threadIdx.x; j < classes; j += kThreads) {
    const float x[1] = {to_float(xr[j])};
    add(acc, x);
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
    row_loss[row] = target == ignore_index ? 0.0f : l - to_float(xr[target]);
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

// Backward: dlogits = (exp(x - lse) - onehot) * scale, scale = dloss / divisor, zeros for an ignored row and for
// the padded columns [classes, stride). Each access covers N consecutive columns of [0, stride).
template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const float* dloss, const T* logits, const int64_t* targets, const float* lse,
                                  const int64_t* divisor, T* dlogits, int64_t classes, int64_t stride,
                                  int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  const bool ignored = target == ignore_index;
  // Rounded like the CPU: the quotient in f64, then to f32.
  const float scale = float(double(*dloss) / double(divisor ? *divisor : 1));
  const float l = lse[row];
  const T* xr = logits + row * stride;
  T* dr = dlogits + row * stride;
  for (int64_t j = int64_t(threadIdx.x) * N; j < stride; j += int64_t(kThreads) * N) {
    StorageVec<T, N> out = *reinterpret_cast<const StorageVec<T, N>*>(xr + j);
    for (int k = 0; k < N; ++k) {
      float d = ignored || j + k >= classes ? 0.0f : expf(to_float(out.v[k]) - l) * scale;
      if (j + k == target) d -= scale;
      from_float(d, &out.v[k]);
    }
    *reinterpret_cast<StorageVec<T, N>*>(dr + j) = out;
  }
}

// Vectors when every row starts 16-byte aligned.
template <class T>
bool vectorizable(const T* p, int64_t stride) {
  return stride % kVecWidth<T> == 0 && aligned16(p);
}

template <class T>
cudaError_t launch_forward(const T* logits, const int64_t* targets, float* lse, float* row_loss, float* loss,
                           int64_t* count, int64_t rows, int64_t classes, int64_t stride, int64_t ignore_index,
                           bool mean, cudaStream_t stream) {
  if (rows > 0) {
    constexpr int W = kVecWidth<T>;
    const cudaError_t launched =
        vectorizable(logits, stride)
            ? launch_kernel(cross_entropy_forward_kernel<T, W>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits,
                            targets, lse, row_loss, classes, stride, ignore_index)
            : launch_kernel(cross_entropy_forward_kernel<T, 1>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits,
                            targets, lse, row_loss, classes, stride, ignore_index);
    if (launched != cudaSuccess) return launched;
  }
  return launch_kernel(cross_entropy_loss_kernel, dim3(1), dim3(kThreads), 0, stream, row_loss, targets, rows,
                       ignore_index, mean, loss, count);
}

template <class T>
cudaError_t launch_backward(const float* dloss, const T* logits, const int64_t* targets, const float* lse,
                            const int64_t* divisor, T* dlogits, int64_t rows, int64_t classes, int64_t stride,
                            int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int W = kVecWidth<T>;
  if (vectorizable(logits, stride) && aligned16(dlogits))
    return launch_kernel(cross_entropy_backward_kernel<T, W>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, dloss,
                         logits, targets, lse, divisor, dlogits, classes, stride, ignore_index);
  return launch_kernel(cross_entropy_backward_kernel<T, 1>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, dloss,
                       logits, targets, lse, divisor, dlogits, classes, stride, ignore_index);
}

}  // namespace

#define MINIDL_CROSS_ENTROPY_LAUNCHERS(T)                                                                              \
  cudaError_t cross_entropy_forward(const T* logits, const int64_t* targets, float* lse, float* row_loss, float* loss, \
                                    int64_t* count, int64_t rows, int64_t classes, int64_t stride,                     \
                                    int64_t ignore_index, bool mean, cudaStream_t stream) {                            \
    return launch_forward(logits, targets, lse, row_loss, loss, count, rows, classes, stride, ignore_index, mean,      \
                          stream);                                                                                     \
  }                                                                                                                    \
  cudaError_t cross_entropy_backward(const float* dloss, const T* logits, const int64_t* targets, const float* lse,    \
                                     const int64_t* divisor, T* dlogits, int64_t rows, int64_t classes,                \
                                     int64_t stride, int64_t ignore_index, cudaStream_t stream) {                      \
    return launch_backward(dloss, logits, targets, lse, divisor, dlogits, rows, classes, stride, ignore_index,         \
                           stream);                                                                                    \
  }
MINIDL_CROSS_ENTROPY_LAUNCHERS(float)
MINIDL_CROSS_ENTROPY_LAUNCHERS(__half)
MINIDL_CROSS_ENTROPY_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_CROSS_ENTROPY_LAUNCHERS

}  // namespace minidl::ops::cuda
