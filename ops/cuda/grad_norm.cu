// The global gradient norm and the clip on the GPU (ops/grad_norm.h; CPU reference optim/clip.cpp). Like
// adamw.cu, every tensor is cut into chunks of kChunk elements and one launch's blocks each take one chunk of any
// tensor (ops/cuda/chunk_list.h), so a GPT's ~150 gradients take one or a few launches, and the norm never leaves
// the device.
#include "ops/cuda/grad_norm.h"

#include "ops/cuda/chunk_list.h"
#include "ops/cuda/device_utils.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int64_t kChunk = 65536;
constexpr int kMaxTensors = 64;
constexpr int kMaxBlocks = 384;

using GradList = ChunkList<float*, kMaxTensors, kMaxBlocks>;
static_assert(sizeof(GradList) + 16 <= 4096, "grad_norm: kernel parameters over 4 KiB");

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

__global__ void __launch_bounds__(kThreads) sum_squares_kernel(GradList list, double* partials) {
  MINIDL_SHARED(double, warp_results, [kWarps]);
  const ChunkRange r = chunk_range<kChunk>(list, blockIdx.x);
  const float* x = list.slot[r.tensor] + r.begin;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < r.size; i += kThreads) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  s = warp_sum_f64(s);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = s;
  __syncthreads();
  s = warp_sum_f64(lane < kWarps ? warp_results[lane] : 0.0);
  if (threadIdx.x == 0) partials[list.first_chunk + blockIdx.x] = s;
}

// One thread adds the chunks' sums in chunk order.
__global__ void sum_partials_f64_kernel(const double* partials, int64_t count, float* out) {
  if (threadIdx.x != 0) return;
  double s = 0.0;
  for (int64_t i = 0; i < count; ++i) s += partials[i];
  *out = static_cast<float>(s);
}

__global__ void __launch_bounds__(kThreads) clip_kernel(GradList list, const float* norm_squared, double max_norm) {
  const double factor = max_norm / (sqrt(static_cast<double>(*norm_squared)) + 1e-6);
  if (!(factor < 1.0)) return;  // nothing to clip (the CPU does not scale either)
  const float f = static_cast<float>(factor);
  const ChunkRange r = chunk_range<kChunk>(list, blockIdx.x);
  float* x = list.slot[r.tensor] + r.begin;
  for (int64_t i = threadIdx.x; i < r.size; i += kThreads) x[i] *= f;
}

// Calls launch(list, blocks) for each full list of the gradients' chunks, in chunk order.
template <class Launch>
cudaError_t for_each_list(const GradNormTensor* tensors, int count, Launch&& launch) {
  return for_each_chunk_list<kChunk, GradList>(
      tensors, count, [](const GradNormTensor& t) { return t.data; }, launch);
}

}  // namespace

int64_t grad_norm_partials(const GradNormTensor* tensors, int count) {
  int64_t chunks = 0;
  for (int i = 0; i < count; ++i) chunks += (tensors[i].n + kChunk - 1) / kChunk;
  return chunks < 1 ? 1 : chunks;
}

cudaError_t grad_norm_squared(const GradNormTensor* tensors, int count, double* partials, float* norm_squared,
                              cudaStream_t stream) {
  int64_t chunks = 0;
  const cudaError_t err = for_each_list(tensors, count, [&](const GradList& list, int blocks) {
    chunks += blocks;
    return launch_kernel(sum_squares_kernel, dim3(blocks), dim3(kThreads), 0, stream, list, partials);
  });
  if (err != cudaSuccess) return err;
  return launch_kernel(sum_partials_f64_kernel, dim3(1), dim3(kWarpSize), 0, stream,
                       static_cast<const double*>(partials), chunks, norm_squared);
}

cudaError_t clip_grads(const GradNormTensor* tensors, int count, const float* norm_squared, double max_norm,
                       cudaStream_t stream) {
  return for_each_list(tensors, count, [&](const GradList& list, int blocks) {
    return launch_kernel(clip_kernel, dim3(blocks), dim3(kThreads), 0, stream, list, norm_squared, max_norm);
  });
}

}  // namespace minidl::ops::cuda
