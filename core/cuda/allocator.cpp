// The caching stream-ordered device allocator (contract in core/cuda/cuda.h).
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/memory.h"
#include "core/size_class.h"
#if defined(MINIDL_CUDA_EMULATED)
#include "cuda_emu/check.h"
#endif

namespace minidl::cuda {

namespace {

constexpr int kMaxDevices = 16;  // as many as core's ledgers

struct CachedBlock {
  void* ptr = nullptr;
  size_t bytes = 0;               // the request rounded up to kBlockRound: what the ledger is charged
  size_t capacity = 0;            // the block's size: its size class (the cache's key)
  cudaStream_t stream = nullptr;  // the stream it was last used on
  MemTag tag = MemTag::kOther;
  uint64_t pool = 0;  // 0: the shared cache; else the graph pool that owns it (begin_graph_pool)
};

struct DeviceCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<CachedBlock>> free_blocks;  // size class -> unused blocks
  std::unordered_map<void*, CachedBlock> live;
  // Graph pools: their unused blocks, handed out only while that pool captures (so the addresses a graph baked
  // in are never another user's), and the pool capturing now (0: none).
  std::unordered_map<uint64_t, std::unordered_map<size_t, std::vector<CachedBlock>>> pool_blocks;
  uint64_t capturing_pool = 0;
  AllocatorStats stats;
};

// Takes a block of size class `capacity` last used on `stream` out of `blocks`; nullptr when there is none.
void* take(std::unordered_map<size_t, std::vector<CachedBlock>>& blocks, size_t capacity, cudaStream_t stream) {
  auto it = blocks.find(capacity);
  if (it == blocks.end()) return nullptr;
  std::vector<CachedBlock>& list = it->second;
  for (size_t i = list.size(); i-- > 0;) {
    if (list[i].stream != stream) continue;  // reusing it would need an event across streams
    void* ptr = list[i].ptr;
    list.erase(list.begin() + std::ptrdiff_t(i));
    return ptr;
  }
  return nullptr;
}

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
      c.stats.cached_bytes -= int64_t(b.capacity);
    }
  c.free_blocks.clear();
}

}  // namespace

size_t size_class(size_t bytes) { return minidl::size_class(round_up(bytes)); }

void* allocate(size_t bytes, int device, size_t* rounded_bytes) {
  const size_t rounded = round_up(bytes), capacity = size_class(rounded);
  cudaStream_t stream = current_stream(device);
  CachedBlock block{nullptr, rounded, capacity, stream, current_mem_tag()};
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  // While a graph captures: its pool's blocks first, then the shared cache's (the block joins the pool for good).
  block.pool = c.capturing_pool;
  if (c.capturing_pool != 0) block.ptr = take(c.pool_blocks[c.capturing_pool], capacity, stream);
  if (block.ptr == nullptr) block.ptr = take(c.free_blocks, capacity, stream);
  if (block.ptr != nullptr) c.stats.cached_bytes -= int64_t(capacity);
  if (block.ptr == nullptr) {
    MINIDL_CHECK(c.capturing_pool == 0, "cuda allocator: a block of ", capacity,
                 " bytes was asked for on cuda:", device,
                 " while a CUDA graph captures and none is cached (cudaMalloc cannot be captured): run the "
                 "captured work once eagerly first (a warm-up step) so that its sizes are cached");
    DeviceGuard guard(device);
    cudaError_t status = cudaMalloc(&block.ptr, capacity);
    if (status == cudaErrorMemoryAllocation && !c.free_blocks.empty()) {
      (void)cudaGetLastError();  // clears the sticky-free error state before retrying
      release_cached(c, device);
      status = cudaMalloc(&block.ptr, capacity);
    }
    MINIDL_CUDA_CHECK(status);
    ++c.stats.cuda_mallocs;
    detail::count_device_malloc();
  }
  c.live.emplace(block.ptr, block);
#if defined(MINIDL_CUDA_EMULATED)  // the emulator's memcheck sees the bytes asked for, not the rounding (check.h)
  minidl::emu::note_block_allocated(block.ptr, bytes, capacity, block.pool == 0, stream);
#endif
  c.stats.allocated_bytes += int64_t(capacity);
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
  c.stats.allocated_bytes -= int64_t(block.capacity);
  c.stats.cached_bytes += int64_t(block.capacity);
  ledger(Device::cuda(device)).add(block.tag, -int64_t(block.bytes));
  // A block freed while a graph captures may still be read by the captured work, which has not run: it joins the
  // graph's pool rather than the shared cache.
  const uint64_t pool = block.pool != 0 ? block.pool : c.capturing_pool;
#if defined(MINIDL_CUDA_EMULATED)
  minidl::emu::note_block_released(block.ptr, block.capacity, pool == 0, block.stream);
#endif
  CachedBlock cached = block;
  cached.pool = pool;
  if (pool != 0)
    c.pool_blocks[pool][block.capacity].push_back(cached);
  else
    c.free_blocks[block.capacity].push_back(cached);
}

uint64_t new_graph_pool() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void begin_graph_pool(int device, uint64_t pool) {
  MINIDL_ASSERT(pool != 0, "begin_graph_pool: pool 0 is the shared cache");
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  MINIDL_CHECK(c.capturing_pool == 0, "cuda allocator: a graph pool already captures on cuda:", device,
               " (one capture per device at a time)");
  c.capturing_pool = pool;
}

void end_graph_pool(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  c.capturing_pool = 0;
}

void release_graph_pool(int device, uint64_t pool) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  if (c.capturing_pool == pool) c.capturing_pool = 0;
  auto it = c.pool_blocks.find(pool);
  if (it != c.pool_blocks.end()) {
    for (auto& [size, blocks] : it->second)
      for (CachedBlock b : blocks) {
        b.pool = 0;
        c.free_blocks[size].push_back(b);
      }
    c.pool_blocks.erase(it);
  }
  for (auto& [ptr, b] : c.live)
    if (b.pool == pool) b.pool = 0;  // freed later: to the shared cache
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
