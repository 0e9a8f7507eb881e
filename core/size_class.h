// The size classes of both caching allocators (core/memory.cpp's CPU cache, core/cuda/allocator.cpp's device cache).
//
// A cache keyed by each request's exact size keeps one block per size ever seen: a mixture of experts' rows per
// expert change every step, and such a cache grew a 4-expert run by ~50 MB a step. Keyed by class, a block serves
// every request of its class: up to 4 KiB each rounded size is its own class; above, eight classes per power of two
// (PyTorch's roundup_power2_divisions), so a block is at most 12.5% larger than asked.
#pragma once

#include <cstddef>

namespace minidl {

// The class of `n` bytes, already rounded to the cache's step (a power of two up to 512): n itself up to 4 KiB,
// then n rounded up to a multiple of 2^floor(log2 n) / 8.
inline size_t size_class(size_t n) {
  if (n <= 4096) return n;
  size_t octave = 4096;
  while (octave <= n / 2) octave *= 2;  // the largest power of two <= n
  const size_t step = octave / 8;
  return (n + step - 1) / step * step;
}

}  // namespace minidl
