// The subset of the CUDA runtime API that minidl's host code uses, over host memory, so the same host code
// links without libcudart in the emulated build. The declarations (and so the exact signatures, enums and C
// linkage) are the toolkit's own, from <cuda_runtime_api.h>.
//
// "Device" memory is host memory: cudaMalloc allocates exactly the requested bytes (256-byte aligned, like
// CUDA) so AddressSanitizer sees every overrun (with the checkers on, check.h, a red zone, a shadow and a
// quarantine for freed memory instead), and the copy kinds are all plain memcpy. With synchronous streams
// (the default) work runs to completion inside the call, so streams and events are no-ops; an event records the
// host time, which makes cudaEventElapsedTime measure the emulated work in between. With deferred streams
// (MINIDL_EMU_STREAMS=async) the stream calls go to streams.cpp, and the synchronous calls synchronise as CUDA's
// do: cudaMemcpy waits for its copy (on the legacy stream), cudaFree and cudaFreeHost for the whole device; a
// cudaMemcpyAsync from pageable host memory takes its bytes at the call, one into pageable memory returns once
// they landed. Device queries: runtime_device.cpp.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"
#include "cuda_emu/stream_state.h"

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

// cudaMemcpyAsync outside capture; host memory as CUDA treats it (runtime.cpp's opening comment).
cudaError_t copy_on(cudaStream_t stream, void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  const bool host_src = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  const bool host_dst = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  cudaError_t status = cudaSuccess;
  if (host_src && !is_pinned(src, count)) {
    auto staged =
        std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + count);
    status = minidl::emu::enqueue(stream, [=] { return copy(dst, staged->data(), count, kind); });
  } else {
    status = minidl::emu::enqueue(stream, [=] { return copy(dst, src, count, kind); });
  }
  if (status == cudaSuccess && host_dst && !is_pinned(dst, count)) status = synchronize_stream(stream);
  return status;
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
  if (const cudaError_t e = minidl::emu::detail::synchronize_device(); e != cudaSuccess) return e;
  return minidl::emu::detail::release(ptr, true);
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return minidl::emu::detail::allocate(ptr, size, false);
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* ptr) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = minidl::emu::detail::synchronize_device(); e != cudaSuccess) return e;
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
  if (!minidl::emu::defers(nullptr)) return minidl::emu::detail::copy(dst, src, count, kind);
  if (const cudaError_t e = minidl::emu::detail::copy_on(nullptr, dst, src, count, kind); e != cudaSuccess) return e;
  return minidl::emu::detail::synchronize_stream(nullptr);
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
  if (minidl::emu::defers(stream) && !minidl::emu::is_capturing(stream))
    return minidl::emu::detail::copy_on(stream, dst, src, count, kind);
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

// Like CUDA's on device memory, queued on the legacy stream without waiting for it (with deferred streams).
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return cudaMemsetAsync(ptr, value, count, nullptr);
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

// A host function in stream order: it runs when the stream reaches it (at once with synchronous streams).
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return minidl::emu::enqueue(stream, [=] {
    fn(user_data);
    return cudaSuccess;
  });
}

// ---- streams and events: synchronous no-ops, or deferred streams (streams.cpp) ----
using minidl::emu::detail::synchronize_device;
using minidl::emu::detail::synchronize_event;
using minidl::emu::detail::synchronize_stream;

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  *stream = new CUstream_st;
  (*stream)->queue = minidl::emu::detail::make_queue((flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}
// A GPU finishes the work queued before the destroy; the emulator runs it now.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t status = minidl::emu::is_capturing(stream) ? cudaSuccess : synchronize_stream(stream);
  delete stream;
  return status;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t e = refuse_if_capturing(stream); e != cudaSuccess) return e;
  return synchronize_stream(stream);
}
// Never cudaErrorNotReady: asking runs the stream's work, so a polling loop ends.
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (minidl::emu::is_capturing(stream)) return cudaSuccess;  // joins across streams are not captured (graph.h)
  return minidl::emu::detail::wait_event(stream, event);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete event;  // a record still queued keeps its state (stream_state.h)
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return minidl::emu::detail::record_event(event, stream);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return synchronize_event(event);
}
// Never cudaErrorNotReady, as cudaStreamQuery.
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::chrono::steady_clock::time_point from, to;
  if (const cudaError_t e = minidl::emu::detail::event_time(start, &from); e != cudaSuccess) return fail(e);
  if (const cudaError_t e = minidl::emu::detail::event_time(end, &to); e != cudaSuccess) return fail(e);
  *ms = std::chrono::duration<float, std::milli>(to - from).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = refuse_during_capture(); e != cudaSuccess) return e;
  return synchronize_device();
}

// ---- errors ----
cudaError_t cudaGetLastError() {
  const cudaError_t error = minidl::emu::detail::last_error;
  minidl::emu::detail::last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError() { return minidl::emu::detail::last_error; }
