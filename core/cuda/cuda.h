// The CUDA side of core (library minidl_cuda_backend, or minidl_cuda_backend_emu built against the CPU emulator of
// CUDA): the device backend behind Tensor's cuda devices, the caching stream-ordered allocator, one compute
// stream per device, events, a device guard and pinned host buffers. Core itself never includes this file or
// links a CUDA runtime; it reaches the device through the hook table in core/device_backend.h.
//
//   Tensor x = Tensor::randn({B, T, C}, Philox(/*seed=*/1), DType::f32, Device::cuda(0));
//   cuda::Event done;  done.record(cuda::current_stream(0));  ...  done.synchronize();
//
// Allocator: blocks are rounded up to 512 bytes and cached by size; a freed block remembers the stream it was
// last used on and is handed out again only for that stream (work queued there before the free is ordered
// before the new user's work), so a training step that asks for the same sizes makes no cudaMalloc or
// cudaFree after the first step. Only empty_cache() (and an allocation that fails while blocks are cached)
// returns memory to CUDA. Live bytes are charged to ledger(Device::cuda(i)) under the current MemTag.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cuda/check.h"

namespace minidl::cuda {

// Registers this library's DeviceBackend for DeviceKind::kCUDA (idempotent). It runs at static initialisation in
// any program that links the backend library; call it again only to restore it. The layers above register
// their own CUDA code (ops/cuda/tensor/register.h); minidl::cuda::register_backend() (dist/cuda/backend.h) does
// every layer at once.
void install_backend();
// Makes every trace span an NVTX range and times it on the device (core/cuda/trace_hooks.cpp); install_backend()
// does.
void install_trace_hooks();

// While one lives, the trace spans this thread starts are timed on `stream` of `device`, on the track "device
// <device>: <name>", instead of on the device's compute stream: the NCCL process group times each collective on
// its communication stream (from DDP's communication thread, whose own spans are not timed on the device).
class TraceStream {
 public:
  TraceStream(cudaStream_t stream, int device, const char* name);
  ~TraceStream();
  TraceStream(const TraceStream&) = delete;
  TraceStream& operator=(const TraceStream&) = delete;

  cudaStream_t stream;
  int device;
  const char* name;

 private:
  const TraceStream* outer_;
};

// The kernel behind DeviceBackend::fill for values that are not one repeated byte (those are a memset):
// dst[0..n) = the low element_bytes (2, 4 or 8) bytes of `pattern`. Core has no kernels of its own: ops/cuda
// (tensor/fill.cpp) provides it when it registers.
using FillKernel = cudaError_t (*)(void* dst, int64_t n, int element_bytes, uint64_t pattern, cudaStream_t stream);
void set_fill_kernel(FillKernel kernel);

// Number of devices the runtime sees (0 when there is none).
int device_count();
// The device's name as the driver reports it ("NVIDIA H100 80GB HBM3"); "CPU emulator of CUDA" when emulated.
std::string device_name(int device);

// The device's compute stream, created on first use (non-blocking with respect to the legacy default stream).
cudaStream_t current_stream(int device);
// The same stream if this process has used the device, null if not (and none is created).
cudaStream_t existing_stream(int device);

// ---- the caching allocator ----
// A block of at least `bytes` for work on current_stream(device), charged to the device's ledger under
// current_mem_tag() by `bytes` rounded up to kBlockRound (returned in *rounded_bytes). The block itself is of
// size_class(bytes), the cache's key: up to 4 KiB every multiple of kBlockRound, above that eight classes per power
// of two (at most 12.5% more than asked), so that shapes which change every step (a mixture of experts' rows per
// expert) reuse blocks rather than leave one cached block per size ever seen (core/memory.h's CPU cache does the
// same). When cudaMalloc fails, the device's cached blocks are freed and it is tried once more.
constexpr size_t kBlockRound = 512;
void* allocate(size_t bytes, int device, size_t* rounded_bytes = nullptr);
size_t size_class(size_t bytes);
// Returns a block from allocate() to the cache (no cudaFree).
void free(void* ptr, int device);
// cudaFree of every cached (unused) block of every device, after synchronizing their streams.
void empty_cache();

// ---- uploads that do not wait ----
// Copies `bytes` from host memory `src` to device memory `dst` on current_stream(device) without the host waiting
// for the device: `src` is copied into one of a ring of page-locked staging buffers before this returns, then a
// cudaMemcpyAsync from there is queued and an event recorded behind it. A buffer is reused only after its event
// has completed: cudaEventQuery finds it done (no wait), or the host waits for it (counted as a host sync). What
// DeviceBackend::upload_async is on CUDA (core/upload.h). Counted as one host -> device copy.
void upload_staged(void* dst, const void* src, size_t bytes, int device);

// Graph pools (PyTorch's private graph memory pools): while a pool captures on a device, every block that device
// hands out comes from the pool's own unused blocks or, failing that, from the shared cache, and then belongs to
// the pool; a block freed during the capture, or freed later but allocated by the pool, goes back to the pool.
// A pool's blocks are handed out again only during a capture into the same pool, so the addresses a captured
// graph reads and writes stay its own for as long as it lives. A capture never calls cudaMalloc (it cannot be
// captured): an allocation the cache cannot serve is an error that asks for an eager warm-up run first.
// cuda::Graph (core/cuda/graph.h) drives these.
uint64_t new_graph_pool();
void begin_graph_pool(int device, uint64_t pool);
void end_graph_pool(int device);
// The pool's unused blocks return to the shared cache, and its live ones will when they are freed (the graph is
// gone, and stream order on the compute stream protects its last replay's work).
void release_graph_pool(int device, uint64_t pool);

struct AllocatorStats {
  int64_t cuda_mallocs = 0;     // calls to cudaMalloc since the start (a steady-state step adds none)
  int64_t cuda_frees = 0;       // calls to cudaFree (empty_cache and out-of-memory retries only)
  int64_t allocated_bytes = 0;  // in live blocks (their size classes)
  int64_t cached_bytes = 0;     // in cached, unused blocks
};
AllocatorStats allocator_stats(int device);

// ---- counters: what the host asked of the devices ----
// Process-wide totals over every device since the start or the last reset_counters(), counted in the host code
// both runtimes share (launch_kernel, this library's copies and synchronizations, the allocator), so the real and
// the emulated backend count the same things. A steady-state training step should show launches only:
//
//   cuda::reset_counters();  trainer.step();  cuda::Counters c = cuda::counters();  // c.host_syncs == 0 ?
struct Counters {
  int64_t kernel_launches = 0;  // launch_kernel calls, plus one per GEMM (cuBLAS/cuBLASLt or the emulated one)
  int64_t memsets = 0;          // cudaMemsetAsync
  int64_t host_syncs = 0;       // the host waited for a device: stream, device or event synchronizations
  int64_t h2d_copies = 0, h2d_bytes = 0;         // host -> device
  int64_t d2h_copies = 0, d2h_bytes = 0;         // device -> host
  int64_t d2d_copies = 0, d2d_bytes = 0;         // device -> device (same or peer device)
  int64_t device_mallocs = 0, device_frees = 0;  // cudaMalloc / cudaFree (the caching allocator's misses)
  int64_t graph_launches = 0;  // cuda::Graph::replay (the kernels a replay runs are not counted again)
};
Counters counters();
void reset_counters();
// Field by field: the counts between two snapshots.
Counters operator-(const Counters& after, const Counters& before);

namespace detail {
// Called by the backend's own code at each event it counts (launch_kernel counts itself, in cuda_compat.h).
void count_library_launch();  // a library call that launches kernels (a GEMM)
void count_memset();
void count_host_sync();
void count_copy(cudaMemcpyKind kind, size_t bytes);  // cudaMemcpyDefault: device to device
void count_device_malloc();
void count_device_free();
void count_graph_launch();
}  // namespace detail

// ---- RAII helpers ----

// Makes `device` current for the calling thread in its scope, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A CUDA event: orders work across streams (record on the producer, wait on the consumer) and times it.
class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  // Work queued on `stream` after this call starts only when the recorded work has finished (no host wait).
  void wait(cudaStream_t stream) const;
  // Blocks the host until the recorded work has finished.
  void synchronize() const;
  // Milliseconds from this event to `end` (both recorded, both with timing).
  float elapsed_ms(const Event& end) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory (cudaMallocHost) for asynchronous host<->device copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace minidl::cuda
