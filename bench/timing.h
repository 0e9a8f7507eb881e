// Timing helpers shared by the benchmark programs: one call's seconds, the median of a set of timings, and the bytes
// that stream from memory rather than from a cache.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace minidl::bench {

// Seconds one call of fn takes.
template <class F>
double seconds(const F& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The middle timing (the upper of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The bytes of each array of a bandwidth measurement, by STREAM's rule: at least 4x the last-level cache, so the
// ops and the copies beside them stream from memory, which is what memory-bound means. Arrays that fit measured
// something else: layer norm's 12 MB of rows (the earlier default, 4096) sat in a 32 MB L3, the copy beside it
// read 57-66 GB/s there against 28-38 from memory, and the op's own arithmetic, not memory, set its %copy. Within
// 32-256 MB, so a server's large L3 does not ask for gigabytes.
inline int64_t stream_array_bytes() {
  int64_t llc = 0;
  if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {  // e.g. "32768K"
    long kib = 0;
    if (std::fscanf(f, "%ldK", &kib) == 1) llc = int64_t(kib) * 1024;
    std::fclose(f);
  }
  if (llc <= 0) llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = int64_t(32) << 20;
  return std::clamp<int64_t>(4 * llc, int64_t(32) << 20, int64_t(256) << 20);
}

}  // namespace minidl::bench
