// The multi-tensor launch that adamw.cu and grad_norm.cu share (apex's multi_tensor_apply): every tensor is cut into
// chunks of kChunk elements, and each block of a launch takes one chunk of any tensor, so a GPT's ~150 parameter
// tensors, many of them small, take one or a few launches instead of one launch each. The list of chunks travels as
// the kernel's by-value parameter (no host-to-device copy to order against the launch); its capacity is chosen by
// the kernel so that the parameters stay under 4 KiB, the limit every supported toolkit and architecture accepts.
//
//   using List = ChunkList<float*, 64, 384>;                         // a slot per tensor: its pointer(s)
//   __global__ void k(List list) {
//     const ChunkRange r = chunk_range<kChunk>(list, blockIdx.x);    // this block's elements [begin, begin + size)
//     float* x = list.slot[r.tensor] + r.begin; ...
//   }
//   for_each_chunk_list<kChunk, List>(tensors, count, [](const T& t) { return t.data; },
//                                     [&](const List& list, int blocks) { return launch_kernel(k, ...); });
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// Up to kMaxTensors tensors (their slots: the pointers a kernel needs, and sizes) and kMaxBlocks chunks of them.
template <class Slot, int kMaxTensorsIn, int kMaxBlocksIn>
struct ChunkList {
  static constexpr int kMaxTensors = kMaxTensorsIn;
  static constexpr int kMaxBlocks = kMaxBlocksIn;
  static_assert(kMaxTensors <= 256, "ChunkList: tensor indices are bytes");

  Slot slot[kMaxTensors];
  int64_t n[kMaxTensors];
  unsigned char tensor[kMaxBlocks];  // block b handles chunk[b] of tensor[b]
  int chunk[kMaxBlocks];
  int64_t first_chunk;  // the index of block 0's chunk among all the tensors' chunks
};

// A block's share of a list: elements [begin, begin + size) of tensor `tensor`.
struct ChunkRange {
  int tensor;
  int64_t begin, size;
};

template <int64_t kChunk, class List>
__device__ __forceinline__ ChunkRange chunk_range(const List& list, int block) {
  const int t = list.tensor[block];
  const int64_t begin = static_cast<int64_t>(list.chunk[block]) * kChunk;
  return {t, begin, list.n[t] - begin < kChunk ? list.n[t] - begin : kChunk};
}

// Calls launch(list, blocks) for each full list of chunks, in chunk order (list.first_chunk counts the chunks of the
// launches before); tensors[i] has .n elements and the slot slot_of(tensors[i]); empty tensors are skipped. Returns
// the first launch error.
template <int64_t kChunk, class List, class Tensor, class SlotOf, class Launch>
cudaError_t for_each_chunk_list(const Tensor* tensors, int count, SlotOf&& slot_of, Launch&& launch) {
  List list{};
  int listed = 0, blocks = 0;
  int64_t done = 0;  // chunks launched so far
  for (int i = 0; i < count; ++i) {
    const Tensor& t = tensors[i];
    if (t.n == 0) continue;
    list.slot[listed] = slot_of(t);
    list.n[listed] = t.n;
    ++listed;
    const int64_t chunks = (t.n + kChunk - 1) / kChunk;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      list.tensor[blocks] = static_cast<unsigned char>(listed - 1);
      list.chunk[blocks] = static_cast<int>(chunk);
      ++blocks;
      const bool last_chunk = chunk == chunks - 1;
      if (blocks < List::kMaxBlocks && !(listed == List::kMaxTensors && last_chunk)) continue;
      list.first_chunk = done;
      const cudaError_t launched = launch(static_cast<const List&>(list), blocks);
      if (launched != cudaSuccess) return launched;
      done += blocks;
      blocks = 0;
      // The next list starts with this tensor in slot 0 if chunks of it remain.
      if (last_chunk) {
        listed = 0;
      } else {
        list.slot[0] = slot_of(t);
        list.n[0] = t.n;
        listed = 1;
      }
    }
  }
  if (blocks == 0) return cudaSuccess;
  list.first_chunk = done;
  return launch(static_cast<const List&>(list), blocks);
}

}  // namespace minidl::ops::cuda
