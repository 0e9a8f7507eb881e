// The caching stream-ordered device allocator (contract in core/cuda/cuda.h).
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/memory.h"

namespace minidl::cuda {

namespace {

constexpr int kMaxDevices = 16;  // as many as core's ledgers

struct CachedBlock {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;  // the stream it was last used on
  MemTag tag = MemTag::kOther;
};

struct DeviceCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<CachedBlock>> free_blocks;  // rounded size -> unused blocks
  std::unordered_map<void*, CachedBlock> live;
  AllocatorStats stats;
};

DeviceCache& cache(int device) {
  MINIDL_CHECK(device >= 0 && device < kMaxDevices, "cuda allocator: device index ", device, " is out of range");
  // Never destroyed: tensors may be freed during static destruction.
  static DeviceCache* caches = new DeviceCache[kMaxDevices];
  return caches[device];
}

size_t round_up(size_t bytes) {
  const size_t n = bytes == 0 ? 1 : bytes;
  return (n + kBlockRound - 1) / kBlockRound * kBlockRound;
}

// Frees a device's unused blocks; the caller holds c.mutex.
void release_cached(DeviceCache& c, int device) {
  if (c.free_blocks.empty()) return;
  DeviceGuard guard(device);
  MINIDL_CUDA_CHECK(cudaDeviceSynchronize());  // queued work may still use a cached block
  detail::count_host_sync();
  for (auto& [size, blocks] : c.free_blocks)
    for (const CachedBlock& b : blocks) {
      MINIDL_CUDA_CHECK(cudaFree(b.ptr));
      ++c.stats.cuda_frees;
      detail::count_device_free();
      c.stats.cached_bytes -= int64_t(b.bytes);
    }
  c.free_blocks.clear();
}

}  // namespace

void* allocate(size_t bytes, int device, size_t* rounded_bytes) {
  const size_t rounded = round_up(bytes);
  cudaStream_t stream = current_stream(device);
  CachedBlock block{nullptr, rounded, stream, current_mem_tag()};
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.free_blocks.find(rounded);
  if (it != c.free_blocks.end()) {
    std::vector<CachedBlock>& blocks = it->second;
    for (size_t i = blocks.size(); i-- > 0;) {
      if (blocks[i].stream != stream) continue;  // reusing it would need an event across streams
      block.ptr = blocks[i].ptr;
      blocks.erase(blocks.begin() + std::ptrdiff_t(i));
      c.stats.cached_bytes -= int64_t(rounded);
      break;
    }
  }
  if (block.ptr == nullptr) {
    DeviceGuard guard(device);
    cudaError_t status = cudaMalloc(&block.ptr, rounded);
    if (status == cudaErrorMemoryAllocation && !c.free_blocks.empty()) {
      (void)cudaGetLastError();  // clears the sticky-free error state before retrying
      release_cached(c, device);
      status = cudaMalloc(&block.ptr, rounded);
    }
    MINIDL_CUDA_CHECK(status);
    ++c.stats.cuda_mallocs;
    detail::count_device_malloc();
  }
  c.live.emplace(block.ptr, block);
  c.stats.allocated_bytes += int64_t(rounded);
  ledger(Device::cuda(device)).add(block.tag, int64_t(rounded));
  if (rounded_bytes) *rounded_bytes = rounded;
  return block.ptr;
}

void free(void* ptr, int device) {
  if (ptr == nullptr) return;
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.live.find(ptr);
  MINIDL_ASSERT(it != c.live.end(), "cuda::free of a pointer the allocator did not hand out on cuda:", device);
  const CachedBlock block = it->second;
  c.live.erase(it);
  c.stats.allocated_bytes -= int64_t(block.bytes);
  c.stats.cached_bytes += int64_t(block.bytes);
  ledger(Device::cuda(device)).add(block.tag, -int64_t(block.bytes));
  c.free_blocks[block.bytes].push_back(block);
}

void empty_cache() {
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceCache& c = cache(d);
    std::lock_guard lock(c.mutex);
    release_cached(c, d);
  }
}

AllocatorStats allocator_stats(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  return c.stats;
}

}  // namespace minidl::cuda
