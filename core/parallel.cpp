#include "core/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
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

// Each thread owns a contiguous run of kPiecesPerThread pieces, in order (thread 0 the first), so an op's rows stay
// on the thread that wrote them in the op before, as with one block per thread. A thread done with its own pieces
// takes the others' from their far end: when one vCPU of a shared VM runs slower for a while (a neighbour on its
// core), the other finishes the region's work instead of waiting at its end. Every piece is claimed once
// (an atomic flag each); the pieces' bounds depend only on n and the thread count, never on who runs them.
// Always 4 per thread, however few grains n holds: with one piece per grain, the residual stream's add (3 grains of
// 32768) ran as 3 pieces on 2 threads, one thread owning 2 of them, and its threads sat idle 23% of their time in it,
// against 10% in 8 pieces (baby config, AVX2, 2 threads, AMD EPYC family 25 model 17).
static constexpr int64_t kPiecesPerThread = 4;

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t most = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);  // about grain each
  const int threads = int(std::min<int64_t>(num_threads(), most));
  if (threads <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
  const int64_t pieces = std::min<int64_t>(int64_t(threads) * kPiecesPerThread, n);
  std::vector<std::atomic<bool>> claimed(static_cast<size_t>(pieces));  // value-initialised: false
  const auto run = [&](int64_t p) {
    if (claimed[size_t(p)].exchange(true, std::memory_order_relaxed)) return false;
    const int64_t b = begin + n * p / pieces, e = begin + n * (p + 1) / pieces;
    if (b < e) fn(b, e);
    return true;
  };
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const auto first = [&](int u) { return pieces * u / threads; };  // thread u owns [first(u), first(u + 1))
    for (int64_t p = first(t); p < first(t + 1); ++p)
      if (!run(p)) break;  // the rest were taken from the far end
    for (int k = 1; k < threads; ++k) {
      const int u = (t + k) % threads;
      for (int64_t p = first(u + 1) - 1; p >= first(u); --p)
        if (!run(p)) break;  // met the owner (or another thief)
    }
  }
}

void parallel_for_parts(const std::vector<int64_t>& sizes, int64_t grain,
                        const std::function<void(size_t, int64_t, int64_t)>& fn) {
  std::vector<int64_t> start(sizes.size() + 1, 0);  // where each part begins in the concatenation
  for (size_t i = 0; i < sizes.size(); ++i) start[i + 1] = start[i] + sizes[i];
  parallel_for(0, start.back(), grain, [&](int64_t b, int64_t e) {
    size_t part = size_t(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (; b < e; ++part) {
      const int64_t end = std::min(e, start[part + 1]);
      if (b < end) fn(part, b - start[part], end - start[part]);
      b = end;
    }
  });
}

}  // namespace minidl
