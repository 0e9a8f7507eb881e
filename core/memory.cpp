#include "core/memory.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/size_class.h"

namespace minidl {

const char* mem_tag_name(MemTag tag) {
  static const char* names[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
  return names[static_cast<int>(tag)];
}

static void update_max(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {}
}

void MemoryLedger::add(MemTag tag, int64_t bytes) {
  int64_t now = current_[idx(tag)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes > 0) {
    update_max(peak_[idx(tag)], now);
    update_max(peak_total_, total);
  }
}

void MemoryLedger::reset_peaks() {
  for (int i = 0; i < kTags; ++i) peak_[i].store(current_[i].load());
  peak_total_.store(total_.load());
}

MemoryLedger& ledger(Device device) {
  static MemoryLedger cpu;
  static MemoryLedger cuda[16];
  if (device.is_cpu()) return cpu;
  MINIDL_CHECK(device.index >= 0 && device.index < 16, "ledger: device index out of range, got ", device.index);
  return cuda[device.index];
}

static thread_local MemTag t_tag = MemTag::kOther;
MemTag current_mem_tag() { return t_tag; }
MemoryTagGuard::MemoryTagGuard(MemTag tag) : prev_(t_tag) { t_tag = tag; }
MemoryTagGuard::~MemoryTagGuard() { t_tag = prev_; }

namespace {
constexpr size_t kAlign = 64;

struct CpuCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks
  int64_t cached_bytes = 0;
  int64_t system_allocs = 0;
  int64_t live_bytes = 0, live_peak = 0;  // blocks handed out (their classes' bytes), and the most at once
};
CpuCache& cache() {
  static CpuCache* c = new CpuCache;  // never destroyed: tensors may be freed during static destruction
  return *c;
}
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
constexpr int64_t kCacheSlack = int64_t(64) << 20;
}  // namespace

size_t cpu_size_class(size_t bytes) { return size_class(round_up(bytes == 0 ? 1 : bytes)); }

Allocation cpu_allocate(size_t bytes) {
  Allocation a;
  a.bytes = round_up(bytes == 0 ? 1 : bytes);
  a.capacity = cpu_size_class(bytes);
  a.tag = t_tag;
  {
    CpuCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(a.capacity);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      a.ptr = it->second.back();
      it->second.pop_back();
      c.cached_bytes -= int64_t(a.capacity);
    } else {
      ++c.system_allocs;
    }
    c.live_bytes += int64_t(a.capacity);
    c.live_peak = std::max(c.live_peak, c.live_bytes);
  }
  if (!a.ptr) {
    a.ptr = std::aligned_alloc(kAlign, a.capacity);
    if (!a.ptr) {
      cpu_empty_cache();
      a.ptr = std::aligned_alloc(kAlign, a.capacity);
    }
    MINIDL_CHECK(a.ptr, "out of CPU memory allocating ", a.bytes, " bytes");
  }
  ledger().add(a.tag, int64_t(a.bytes));
  return a;
}

void cpu_free(const Allocation& a) {
  if (!a.ptr) return;
  ledger().add(a.tag, -int64_t(a.bytes));
  CpuCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.live_bytes -= int64_t(a.capacity);
  if (c.cached_bytes + int64_t(a.capacity) > 2 * c.live_peak + kCacheSlack) {
    std::free(a.ptr);  // the cache is full: the block goes back to the system
    return;
  }
  c.free_blocks[a.capacity].push_back(a.ptr);
  c.cached_bytes += int64_t(a.capacity);
}

void cpu_empty_cache() {
  CpuCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.cached_bytes = 0;
}

int64_t cpu_cached_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().cached_bytes;
}

int64_t cpu_system_allocs() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().system_allocs;
}

}  // namespace minidl
