// The subset of the CUDA runtime API that minidl's host code uses, over host memory, so the same host code
// links without libcudart in the emulated build. The declarations (and so the exact signatures, enums and C
// linkage) are the toolkit's own, from <cuda_runtime_api.h>.
//
// "Device" memory is host memory: cudaMalloc allocates exactly the requested bytes (256-byte aligned, like
// CUDA) so AddressSanitizer sees every overrun, or, with the checkers on (check.h), adds a red zone, a shadow
// and a quarantine for freed memory; the copy kinds are all plain memcpy. Kernels run to
// completion inside the launch, so streams and events are synchronous no-ops; an event records the host time,
// which makes cudaEventElapsedTime measure the emulated work in between. Device queries: runtime_device.cpp.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"
#include "cuda_emu/stream_state.h"

struct CUevent_st {
  std::chrono::steady_clock::time_point time;
  bool recorded = false;
};

namespace minidl::emu::detail {
namespace {

thread_local cudaError_t last_error = cudaSuccess;

struct Registry {
  std::mutex mutex;
  std::unordered_set<void*> device;    // live allocations, so frees can be checked
  std::map<const char*, size_t> host;  // page-locked host allocations and their sizes (a capture checks copies)
};
Registry& registry() {
  static Registry r;
  return r;
}

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

cudaError_t allocate(void** ptr, size_t size, bool device) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  if (device && check_allocate(ptr, size, options().checks)) {  // with a red zone and a shadow (check.h)
    if (*ptr == nullptr) return fail(cudaErrorMemoryAllocation);
  } else if (posix_memalign(ptr, 256, size) != 0) {
    return fail(cudaErrorMemoryAllocation);
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (device)
    r.device.insert(*ptr);
  else
    r.host.emplace(static_cast<const char*>(*ptr), size);
  return cudaSuccess;
}

cudaError_t release(void* ptr, bool device) {
  if (ptr == nullptr) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    if ((device ? r.device.erase(ptr) : r.host.erase(static_cast<const char*>(ptr))) == 0)
      return fail(cudaErrorInvalidValue);
  }
  if (device && check_release(ptr) != 0) return cudaSuccess;  // quarantined (check.h)
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  std::memcpy(dst, src, count);
  check_host_write(dst, count);
  return cudaSuccess;
}

// Whether [p, p + count) lies in one page-locked host allocation (cudaMallocHost).
bool is_pinned(const void* p, size_t count) {
  const char* c = static_cast<const char*>(p);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.host.upper_bound(c);
  if (it == r.host.begin()) return false;
  --it;
  return c >= it->first && c + count <= it->first + it->second;
}

size_t physical_memory(int pages_name) {
  return static_cast<size_t>(sysconf(pages_name)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

void set_last_error(cudaError_t error) { last_error = error; }

}  // namespace minidl::emu::detail

using minidl::emu::detail::fail;
using minidl::emu::detail::refuse_during_capture;
using minidl::emu::detail::refuse_if_capturing;

// ---- memory ----
// None of them may be called while a capture is active (graph.h).
cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return minidl::emu::detail::allocate(ptr, size, true);
}
cudaError_t cudaFree(void* ptr) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return minidl::emu::detail::release(ptr, true);
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return minidl::emu::detail::allocate(ptr, size, false);
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* ptr) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return minidl::emu::detail::release(ptr, false);
}
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) { return cudaMalloc(ptr, size); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return cudaFree(ptr); }

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  *free = minidl::emu::detail::physical_memory(_SC_AVPHYS_PAGES);
  *total = minidl::emu::detail::physical_memory(_SC_PHYS_PAGES);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;  // synchronous
  return minidl::emu::detail::copy(dst, src, count, kind);
}
// Captured unless it touches pageable host memory (cudaMemcpyDefault is taken as device to device).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (minidl::emu::is_capturing(stream)) {
    using minidl::emu::detail::is_pinned;
    const bool host_src = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
    const bool host_dst = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
    if ((host_src && !is_pinned(src, count)) || (host_dst && !is_pinned(dst, count)))
      return refuse_if_capturing(stream);
  }
  return minidl::emu::enqueue(stream, [=] { return minidl::emu::detail::copy(dst, src, count, kind); });
}
cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind kind) {
  if (symbol == nullptr) return fail(cudaErrorInvalidSymbol);
  return minidl::emu::detail::copy(static_cast<char*>(const_cast<void*>(symbol)) + offset, src, count, kind);
}
cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind kind) {
  if (symbol == nullptr) return fail(cudaErrorInvalidSymbol);
  return minidl::emu::detail::copy(dst, static_cast<const char*>(symbol) + offset, count, kind);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;  // synchronous
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  std::memset(ptr, value, count);
  minidl::emu::detail::check_host_write(ptr, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  return minidl::emu::enqueue(stream, [=] {
    std::memset(ptr, value, count);
    minidl::emu::detail::check_host_write(ptr, count);
    return cudaSuccess;
  });
}

// ---- streams and events: every operation has completed when its call returns (or, captured, is in the graph) ----
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return refuse_if_capturing(stream); }
cudaError_t cudaStreamQuery(cudaStream_t stream) { return refuse_if_capturing(stream); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event == nullptr ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  event->time = std::chrono::steady_clock::now();
  event->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return refuse_during_capture();
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr || !start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return refuse_during_capture(); }

// ---- errors ----
cudaError_t cudaGetLastError() {
  const cudaError_t error = minidl::emu::detail::last_error;
  minidl::emu::detail::last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError() { return minidl::emu::detail::last_error; }
