#include "core/parallel.h"

#include <alloca.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace minidl {

// How long an idle OpenMP thread spins before it sleeps. libgomp reads GOMP_SPINCOUNT once, as it loads, and its
// default (300,000 pauses when OMP_WAIT_POLICY is unset) keeps a thread spinning through most serial gaps of a
// training step. Where two vCPUs share one physical core (the Zen 1 cloud VM this was measured on), the spinning
// takes the core from the thread doing the work: the baby config's 2-thread step took 96-107 ms with the default,
// 77-78 ms at 10,000, 80 ms at 0 (passive) and 100-112 ms at 100,000 (bench_gpt_step, docs/decisions.md).
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
