// Memory: the caching CPU allocator and the memory ledger.
//
// Every tensor's storage comes from allocate(). Freed blocks go back to a cache keyed by their size class (below), so
// a training loop that asks for the same shapes every step stops calling malloc after the first step.
//
// The ledger counts live bytes per tag (params, grads, optimizer state, activations, comm buffers, other) and
// remembers each tag's peak. A MemoryTagGuard sets the tag for allocations made in its scope on this thread:
//
//   { MemoryTagGuard tag(MemTag::kActivations); auto y = model.forward(x); }
//   ledger().peak(MemTag::kActivations)   // bytes
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace minidl {

enum class MemTag : uint8_t { kParams, kGrads, kOptimizer, kActivations, kComm, kOther, kCount };
const char* mem_tag_name(MemTag tag);

class MemoryLedger {
 public:
  static constexpr int kTags = static_cast<int>(MemTag::kCount);

  void add(MemTag tag, int64_t bytes);
  int64_t current(MemTag tag) const { return current_[idx(tag)].load(std::memory_order_relaxed); }
  int64_t peak(MemTag tag) const { return peak_[idx(tag)].load(std::memory_order_relaxed); }
  int64_t current_total() const { return total_.load(std::memory_order_relaxed); }
  int64_t peak_total() const { return peak_total_.load(std::memory_order_relaxed); }
  // Starts a new peak window: every peak becomes the current value.
  void reset_peaks();

 private:
  static int idx(MemTag t) { return static_cast<int>(t); }
  std::array<std::atomic<int64_t>, kTags> current_{};
  std::array<std::atomic<int64_t>, kTags> peak_{};
  std::atomic<int64_t> total_{0}, peak_total_{0};
};

// The ledger of a device (one per device kind and index).
MemoryLedger& ledger(Device device = Device::cpu());

// The tag new allocations on this thread are charged to (default kOther).
MemTag current_mem_tag();

class MemoryTagGuard {
 public:
  explicit MemoryTagGuard(MemTag tag);
  ~MemoryTagGuard();
  MemoryTagGuard(const MemoryTagGuard&) = delete;
  MemoryTagGuard& operator=(const MemoryTagGuard&) = delete;

 private:
  MemTag prev_;
};

struct Allocation {
  void* ptr = nullptr;
  size_t bytes = 0;     // the request rounded up to 64 bytes: what the ledger counts
  size_t capacity = 0;  // the block's size: its size class (the cache's key)
  MemTag tag = MemTag::kOther;
};

// CPU caching allocator: 64-byte aligned blocks; free() returns a block to the cache.
//
// Blocks come in size classes, so that shapes which change every step (a mixture of experts' rows per expert)
// reuse blocks instead of leaving one cached block per size ever seen (an exact-size cache grew by ~50 MB a step
// that way): up to 4 KiB every multiple of 64 bytes; above, eight classes per power of two (n rounded up to a
// multiple of 2^floor(log2 n) / 8: at most 12.5% more than asked). The cache holds at most twice the most bytes
// ever live at once plus 64 MiB; a block freed beyond that goes back to the system.
Allocation cpu_allocate(size_t bytes);
void cpu_free(const Allocation& a);
// The size class a request of `bytes` is served from.
size_t cpu_size_class(size_t bytes);
// Returns all cached blocks to the system (tests and memory reports).
void cpu_empty_cache();
// Bytes currently held in the cache (allocated from the system but not in use).
int64_t cpu_cached_bytes();
// Number of times the allocator had to ask the system for memory (a steady-state step adds none).
int64_t cpu_system_allocs();

}  // namespace minidl
