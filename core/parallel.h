// One CPU thread pool (OpenMP) shared by minidl's kernels and by BLAS (OpenBLAS built for OpenMP), so the two
// never oversubscribe the cores. set_num_threads() sets both.
//
//   parallel_for(0, rows, /*grain=*/16, [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
#pragma once

#include <cstdint>
#include <functional>

namespace minidl {

void set_num_threads(int n);
int num_threads();
// Cores on this host divided among the ranks sharing it (at least 1).
int default_num_threads(int ranks_on_host = 1);
// True inside a parallel_for body (kernels called there must run single-threaded).
bool in_parallel_region();

// Splits [begin, end) into at most num_threads() contiguous chunks of at least `grain` items and runs fn on each.
// Runs inline when the range is small or when already inside a parallel region.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace minidl
