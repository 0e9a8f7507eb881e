// Timing helpers shared by the benchmark programs: one call's seconds, and the median of a set of timings.
#pragma once

#include <algorithm>
#include <chrono>
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

}  // namespace minidl::bench
