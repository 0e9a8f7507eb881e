// launch.h — emulated kernel launches and the emulator's options (included by emulator.h).
//
// Kernels are launched through launch_kernel() from cuda_compat.h, which calls minidl::emu::launch. A launch
// validates the configuration like CUDA (on failure it sets the last error, see cudaGetLastError, and runs
// nothing), then, with synchronous streams (the default), runs every block to completion before returning. On a
// capturing stream, or with deferred streams (MINIDL_EMU_STREAMS=async, emulator.h), the launch is queued instead,
// with a copy of its arguments (graph.h).
//
// Options come from the environment when the first launch happens, and tests may replace them:
//   MINIDL_EMU_ORDER    forward | reverse | random   order in which a scheduling pass runs a block's threads
//   MINIDL_EMU_SEED     integer (default 1)           seed of the random order (each block derives its own)
//   MINIDL_EMU_STRICT   1 | 0 (default 1)             see emulator.h
//   MINIDL_EMU_WORKERS  integer (default: hardware threads)   OS threads running blocks, the caller included
//   MINIDL_EMU_STACK_KB integer (default 64, 256 under ASan)  stack of each emulated thread
//   MINIDL_EMU_CHECK    all (default) | none | initcheck,memcheck,racecheck   the checkers (check.h)
//   MINIDL_EMU_STREAMS  sync | async (default sync)    streams run work when queued, or defer it (emulator.h)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_emu/graph.h"

namespace minidl::emu {

enum class Order { kForward, kReverse, kRandom };
// kSync: stream work runs when it is queued. kAsync: deferred streams, ordered only by events and synchronisation.
enum class StreamMode { kSync, kAsync };

struct Options {
  Order order = Order::kForward;
  uint64_t seed = 1;
  bool strict = true;
  int workers = 1;
  size_t stack_bytes = 64 * 1024;
  unsigned checks = 7;  // kInitcheck | kMemcheck | kRacecheck (check.h); 0 when not compiled in
  StreamMode streams = StreamMode::kSync;
};

// The options in force (read from the environment on first use).
Options options();
// Replaces them; call between launches, not during one. Runs every stream's deferred work first.
void set_options(const Options& options);

namespace detail {

// A launch as the scheduler sees it: `body(closure)` runs the kernel for the current thread.
struct KernelLaunch {
  dim3 grid, block;
  size_t smem_bytes;
  const void* kernel;  // identifies the kernel for cudaFuncSetAttribute limits
  void (*body)(const void* closure);
  const void* closure;
  const std::vector<void*>* frames = nullptr;  // host frames of a queued launch's call, for the checkers' reports
};

// The caller's host frames when the checkers are on (check.h), else null: a queued launch keeps them so that a
// report names where it was launched, not where the host waited for it.
std::shared_ptr<const std::vector<void*>> launch_frames();

// Validates, then runs every block; returns (and records as the last error) any configuration error.
cudaError_t run_kernel(const KernelLaunch& launch);
// The validation alone (a deferred launch reports its configuration error when it is queued, as CUDA does).
cudaError_t check_launch(const KernelLaunch& launch);

// This worker's dynamic shared memory for the block it runs.
unsigned char* dynamic_smem_base();

// One MINIDL_SHARED declaration (cuda_compat.h) on one worker: its storage, exactly its size so AddressSanitizer
// sees overruns, and the block it was last poisoned for. Each site is a `static thread_local` of its own.
struct StaticSmemSite {
  uint64_t block = 0;  // the worker's block generation; 0: never reached
  unsigned char* data = nullptr;
  StaticSmemSite() = default;
  StaticSmemSite(const StaticSmemSite&) = delete;
  StaticSmemSite& operator=(const StaticSmemSite&) = delete;
  ~StaticSmemSite();
};

// The storage of `site` for the block this worker runs. The first thread of a block to reach the declaration
// fills it with 0xFF bytes and adds it to the block's static shared memory, which must stay within 48 KiB
// (and, with the dynamic shared memory, within the kernel's limit); the others get the same bytes.
unsigned char* static_smem(StaticSmemSite& site, size_t bytes, size_t alignment, const char* name, const char* file,
                           int line);

}  // namespace detail

// Runs kernel(args...) on every thread of the grid. Arguments are converted to the kernel's parameter types
// once, like CUDA's parameter buffer, and each thread gets its own copy of them (kernels may modify their
// parameters).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: wrong number of kernel arguments");
  struct Closure {
    void (*kernel)(Params...);
    std::tuple<Params...> params;
  };
  const Closure closure{kernel, std::tuple<Params...>(std::forward<Args>(args)...)};
  const auto body = [](const void* p) {
    const Closure& c = *static_cast<const Closure*>(p);
    std::apply([&c](Params... params) { c.kernel(params...); }, c.params);
  };
  const void* id = reinterpret_cast<const void*>(kernel);
  if (defers(stream)) {  // queued or captured with a copy of its arguments (graph.h)
    if (!is_capturing(stream))
      if (const cudaError_t error = detail::check_launch({grid, block, smem_bytes, id, body, &closure});
          error != cudaSuccess)
        return error;
    const std::shared_ptr<const std::vector<void*>> frames = detail::launch_frames();
    return enqueue(stream, [=] {
      return detail::run_kernel({grid, block, smem_bytes, id, body, &closure, frames.get()});
    });
  }
  return detail::run_kernel({grid, block, smem_bytes, id, body, &closure});
}

}  // namespace minidl::emu

// cuda_runtime.h declares this convenience overload for nvcc only; shared code passes kernels to it directly.
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
