#include <alloca.h>
#include <unistd.h>

#include <cstring>

namespace minidl {

// How long an idle OpenMP thread spins before it sleeps. libgomp reads GOMP_SPINCOUNT once, as it loads, and its
// default (300,000 pauses when OMP_WAIT_POLICY is unset) keeps a thread spinning through most serial gaps of a
// training step. Where two vCPUs share one physical core (the Zen 1 cloud VM this was measured on), the spinning
// takes the core from the thread doing the work: the baby config's 2-thread step took 96-107 ms with the default,
// 77-78 ms at 10,000, 80 ms at 0 (passive) and 100-112 ms at 100,000 (bench_gpt_step; docs/building.md, "CPU threads").
// 10,000 pauses still cover the short gaps between the parallel loops of one op.
//
// The environment has to say so before libgomp's initialiser runs, and libc's own initialiser discards a setenv
// made earlier, so a program re-executes itself once with GOMP_SPINCOUNT=10000 added, from the executable's
// .preinit_array (it runs before every library's initialiser: nothing has been set up to lose). It never overrides
// the user's OMP_WAIT_POLICY or GOMP_SPINCOUNT, and goes on unchanged if the exec fails. It executes the file by
// its own path (read from /proc/self/exe), not by /proc/self/exe: the kernel names a process after the file it
// executes, and ps, top, pgrep and a scheduler's process list must show train_gpt, not "exe".
//
// It is the program's choice, not the library's: a program that links this object (CMake target
// minidl_program_defaults: minidl's own programs and benchmarks) re-executes itself; a program of one's own that
// links only the library does not (set GOMP_SPINCOUNT=10000 in its environment for the same effect,
// docs/building.md "CPU threads").
static void default_openmp_spin(int, char** argv, char** envp) {
  size_t n = 0;
  for (; envp[n]; ++n)
    if (!std::strncmp(envp[n], "OMP_WAIT_POLICY=", 16) || !std::strncmp(envp[n], "GOMP_SPINCOUNT=", 15)) return;
  char** env = static_cast<char**>(alloca((n + 2) * sizeof(char*)));  // before libc's initialiser: no malloc
  std::memcpy(env, envp, n * sizeof(char*));
  env[n] = const_cast<char*>("GOMP_SPINCOUNT=10000");
  env[n + 1] = nullptr;
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) return;
  path[length] = '\0';
  execve(path, argv, env);
}
[[gnu::used, gnu::section(".preinit_array")]] static void (*const preinit_openmp_spin)(int, char**,
                                                                                       char**) = default_openmp_spin;

}  // namespace minidl
