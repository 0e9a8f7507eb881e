// Multi-tensor fused AdamW on the GPU (ops/adamw.h; CPU reference ops/cpu/adamw.cpp). A GPT has ~150 parameter
// tensors, many of them small (biases, layernorm weights): one launch per tensor would be ~150 launches of mostly
// idle blocks. Instead every tensor is cut into chunks of kChunk elements, and one launch's blocks each take one
// chunk of any tensor, as apex's multi_tensor_apply does (ops/cuda/chunk_list.h). The per-element update is
// kernels::adamw_element, the function the CPU loop calls, so both compute the same thing operation for operation.
#include "ops/cuda/adamw_found_inf.h"
#include "ops/cuda/chunk_list.h"
#include "ops/cuda/device_utils.h"
#include "ops/cuda/adamw.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kChunk = 65536;  // elements per block: 128 per thread, enough to hide the launch of a block
constexpr int kMaxTensors = 36;
constexpr int kMaxBlocks = 320;

// The pointers of one tensor in the chunk list (ops/cuda/chunk_list.h).
struct AdamWSlot {
  float* param;
  const float* grad;
  float* m;
  float* v;
};
using TensorList = ChunkList<AdamWSlot, kMaxTensors, kMaxBlocks>;
static_assert(sizeof(TensorList) + sizeof(minidl::kernels::AdamWConstants) + sizeof(AdamWDeviceStep) <= 4096,
              "fused_adamw: kernel parameters over 4 KiB");

// Four floats of each buffer at a time when all four are 16-byte aligned (chunk starts are multiples of 4), the
// chunk's last n % 4 elements one at a time.
// With d.found_inf set, the step is skipped when *d.found_inf != 0 and its constants come from the device's step
// count (d.step - *d.skipped) instead of `c`.
__global__ void __launch_bounds__(kThreads)
    fused_adamw_kernel(TensorList list, minidl::kernels::AdamWConstants c, AdamWDeviceStep d) {
  if (d.found_inf != nullptr) {
    if (*d.found_inf) return;
    const double lr = d.lr_on_device != nullptr ? *d.lr_on_device : d.lr;
    c = minidl::kernels::adamw_constants(lr, d.beta1, d.beta2, d.eps, d.weight_decay, d.step - *d.skipped);
  }
  const ChunkRange r = chunk_range<kChunk>(list, blockIdx.x);
  const AdamWSlot& slot = list.slot[r.tensor];
  const int64_t begin = r.begin, size = r.size;
  float* p = slot.param + begin;
  const float* g = slot.grad + begin;
  float* m = slot.m + begin;
  float* v = slot.v + begin;
  int64_t scalar_from = 0;
  if (aligned16(p, g, m, v)) {
    for (int64_t i = threadIdx.x * 4; i + 4 <= size; i += kThreads * 4) {
      FloatVec<4> pv = load_vec<4>(p + i), mv = load_vec<4>(m + i), vv = load_vec<4>(v + i);
      const FloatVec<4> gv = load_vec<4>(g + i);
      for (int k = 0; k < 4; ++k) minidl::kernels::adamw_element(pv.v[k], gv.v[k], mv.v[k], vv.v[k], c);
      store_vec<4>(p + i, pv);
      store_vec<4>(m + i, mv);
      store_vec<4>(v + i, vv);
    }
    scalar_from = size / 4 * 4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < size; i += kThreads)
    minidl::kernels::adamw_element(p[i], g[i], m[i], v[i], c);
}

// One thread counts the skipped step after the update kernels read the count.
__global__ void count_skipped_kernel(const int* found_inf, int64_t* skipped) {
  if (threadIdx.x == 0 && *found_inf) *skipped += 1;
}

__global__ void add_to_count_kernel(int64_t* count, int64_t delta) {
  if (threadIdx.x == 0) *count += delta;
}

cudaError_t launch_adamw(const AdamWTensor* tensors, int count, const minidl::kernels::AdamWConstants& constants,
                         const AdamWDeviceStep& device_step, cudaStream_t stream) {
  return for_each_chunk_list<kChunk, TensorList>(
      tensors, count,
      [](const AdamWTensor& t) {
        return AdamWSlot{t.param, t.grad, t.m, t.v};
      },
      [&](const TensorList& list, int blocks) {
        return launch_kernel(fused_adamw_kernel, dim3(blocks), dim3(kThreads), 0, stream, list, constants, device_step);
      });
}

}  // namespace

cudaError_t fused_adamw(const AdamWTensor* tensors, int count, const minidl::kernels::AdamWConstants& constants,
                        cudaStream_t stream) {
  return launch_adamw(tensors, count, constants, AdamWDeviceStep{}, stream);
}

cudaError_t fused_adamw_unless_found_inf(const AdamWTensor* tensors, int count, const AdamWDeviceStep& step,
                                         cudaStream_t stream) {
  const cudaError_t launched = launch_adamw(tensors, count, minidl::kernels::AdamWConstants{}, step, stream);
  if (launched != cudaSuccess || !step.count_skip) return launched;
  return launch_kernel(count_skipped_kernel, dim3(1), dim3(kWarpSize), 0, stream, step.found_inf, step.skipped);
}

cudaError_t add_to_count(int64_t* count, int64_t delta, cudaStream_t stream) {
  return launch_kernel(add_to_count_kernel, dim3(1), dim3(1), 0, stream, count, delta);
}

}  // namespace minidl::ops::cuda
