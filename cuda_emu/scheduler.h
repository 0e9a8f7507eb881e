// scheduler.h — the pieces of minidl_cuda_emu that its .cpp files share (internal; kernels never include it).
//
//   grid.cpp     options, the worker pool, launch validation
//   block.cpp    one block on one worker: fibers, barriers, warp collectives, reports
//   fiber.cpp    stacks and context switches
//   runtime.cpp          the host runtime subset: memory, copies, streams, events, last error
//   runtime_device.cpp   device queries, kernel attributes, error strings
//   streams.cpp          deferred streams (async mode): queues, event waits, who runs what when
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <shared_mutex>
#include <vector>

#include "cuda_emu/launch.h"

namespace minidl::emu::detail {

// One emulated thread's cp.async copies (warp_matrix.cpp): issued in order, each group closed by a commit. The
// destination bytes were poisoned at issue; `bytes` are what lands there when a wait completes the copy's group.
struct AsyncCopy {
  unsigned char* dst;
  unsigned char bytes[16];
  int size;
};
struct AsyncCopies {
  std::vector<AsyncCopy> pending;      // not yet landed, oldest first
  std::vector<size_t> committed_ends;  // per committed group not yet waited for: its end in `pending`
};
// The calling emulated thread's (aborts outside a kernel).
AsyncCopies& async_copies_of_current_thread();

// The checkers (check.cpp, check.h). The scheduler tells them which block and thread run, where shared memory
// is and when barriers and warp collectives complete; all are no-ops when the checkers are off.
void check_block_begin(const KernelLaunch& launch, const Options& options, uint3 block, int threads,
                       unsigned char* dynamic_smem, size_t dynamic_bytes);
void check_thread(int thread, const void* stack_bottom, size_t stack_bytes);
void check_static_smem(const void* data, size_t bytes, const char* name);
void check_barrier();
void check_warp_synced(int warp);
void check_block_end();
// An access the emulator makes on a kernel thread's behalf (cp.async), checked like the kernel's own.
void check_access(const void* address, size_t bytes, bool write, const void* pc);
// Held shared for a whole launch, so device allocations do not change under the workers.
std::shared_mutex& check_launch_mutex();
// Remembers the host frames of the launch about to run, for the reports.
void note_launch_frames(const Options& options, const std::vector<void*>* queued);
// runtime.cpp: a device allocation with a red zone and shadow (false: checkers off, allocate plainly), its
// release (1: done, 0: not one of the checkers' allocations, -1: already freed), and a copy or set into it.
bool check_allocate(void** ptr, size_t size, unsigned checks);
int check_release(void* ptr);
void check_host_write(const void* dst, size_t bytes);

// Runs block `block_index` (linear, x fastest) of `launch` on the calling OS thread.
void run_block(const KernelLaunch& launch, uint64_t block_index, const Options& options);

// The threadIdx of the block's `i`-th thread (x fastest).
uint3 thread_index(int i, const dim3& block);

// True while the calling OS thread is running a block (so a launch from a kernel can be refused).
bool inside_kernel();

// Prints "cuda_emu: <message>" to stderr and aborts the process.
[[noreturn]] void fatal(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The calling host thread's last error, as cudaGetLastError reports it.
void set_last_error(cudaError_t error);

// Dynamic shared memory a launch of `kernel` may request (48 KiB unless raised by cudaFuncSetAttribute).
size_t max_dynamic_smem(const void* kernel);

// The limits the emulated device reports in cudaGetDeviceProperties and enforces at launch.
inline constexpr size_t kDefaultDynamicSmem = 48 * 1024;    // also all a block may have without opting in
inline constexpr size_t kMaxStaticSmem = 48 * 1024;         // ptxas refuses more __shared__ in one kernel
inline constexpr size_t kMaxDynamicSmemOptin = 163 * 1024;  // an A100's (H100: 227 KiB)
inline constexpr int kMaxThreadsPerBlock = 1024;

}  // namespace minidl::emu::detail
