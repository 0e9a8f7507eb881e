#include "core/parallel.h"

#include <alloca.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace minidl {

// How long an idle OpenMP thread spins before it sleeps. libgomp reads GOMP_SPINCOUNT once, as it loads, and its
// default (300,000 pauses when OMP_WAIT_POLICY is unset) keeps a thread spinning through most serial gaps of a
// training step. Where two vCPUs share one physical core (the Zen 1 cloud VM this was measured on), the spinning
// takes the core from the thread doing the work: the baby config's 2-thread step took 96-107 ms with the default,
// 77-78 ms at 10,000, 80 ms at 0 (passive) and 100-112 ms at 100,000 (bench_gpt_step; docs/building.md, "CPU threads").
// 10,000 pauses still cover the short gaps between the parallel loops of one op.
//
// The environment has to say so before libgomp's initialiser runs, and libc's own initialiser discards a setenv
// made earlier, so a program that links minidl re-executes itself once with GOMP_SPINCOUNT=10000 added, from the
// executable's .preinit_array (it runs before every library's initialiser: nothing has been set up to lose). It
// never overrides the user's OMP_WAIT_POLICY or GOMP_SPINCOUNT, and goes on unchanged if the exec fails. This file
// is in every program: parallel_for is.
static void default_openmp_spin(int, char** argv, char** envp) {
  size_t n = 0;
  for (; envp[n]; ++n)
    if (!std::strncmp(envp[n], "OMP_WAIT_POLICY=", 16) || !std::strncmp(envp[n], "GOMP_SPINCOUNT=", 15)) return;
  char** env = static_cast<char**>(alloca((n + 2) * sizeof(char*)));  // before libc's initialiser: no malloc
  std::memcpy(env, envp, n * sizeof(char*));
  env[n] = const_cast<char*>("GOMP_SPINCOUNT=10000");
  env[n + 1] = nullptr;
  execve("/proc/self/exe", argv, env);
}
[[gnu::used, gnu::section(".preinit_array")]] static void (*const preinit_openmp_spin)(int, char**, char**) =
    default_openmp_spin;

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
