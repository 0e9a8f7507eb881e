#include "core/parallel.h"

#include <omp.h>

#include <algorithm>
#include <thread>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace minidl {

static int g_threads = 0;

void set_num_threads(int n) {
  MINIDL_CHECK(n >= 1, "set_num_threads: expected at least 1 thread, got ", n);
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  if (g_threads == 0) set_num_threads(default_num_threads());
  return g_threads;
}

int default_num_threads(int ranks_on_host) {
  int cores = int(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, ranks_on_host));
}

bool in_parallel_region() { return omp_in_parallel(); }

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  int64_t n = end - begin;
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(num_threads(), (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = begin + n * c / chunks, e = begin + n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  }
}

}  // namespace minidl
