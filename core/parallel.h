// One CPU thread pool (OpenMP) shared by minidl's kernels and by BLAS (OpenBLAS built for OpenMP), so the two
// never oversubscribe the cores. set_num_threads() sets both.
//
//   parallel_for(0, rows, /*grain=*/16, [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace minidl {

void set_num_threads(int n);
int num_threads();
// Cores on this host divided among the ranks sharing it (at least 1).
int default_num_threads(int ranks_on_host = 1);
// True inside a parallel_for body (kernels called there must run single-threaded).
bool in_parallel_region();

// Runs fn on contiguous pieces of [begin, end) on up to ceil(n / grain) threads (`grain` items is the least work
// worth a thread), 4 pieces per thread (fewer only where n is): each thread its own run of them first, so
// consecutive ops keep their rows on one thread, and a thread done early runs the others' remaining pieces
// (core/parallel.cpp). fn must not depend on which thread runs a piece. Runs inline when the range is small or
// when already inside a parallel region.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// One parallel_for over several arrays laid end to end (sizes[i] items in part i): fn(part, begin, end) for each
// piece of a part that one of parallel_for's pieces covers, in part order within it. A multi-tensor pass (the
// optimizer's update over all parameters) forks and joins once instead of once per tensor, and tensors below
// `grain` no longer run alone on one thread.
void parallel_for_parts(const std::vector<int64_t>& sizes, int64_t grain,
                        const std::function<void(size_t, int64_t, int64_t)>& fn);

}  // namespace minidl
