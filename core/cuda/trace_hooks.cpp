// What a trace (core/trace.h) gets from a CUDA device: every span as an NVTX range, and every span's device time.
//
// NVTX: a profile of a --trace run under Nsight Systems (nsys profile --trace cuda,nvtx) shows the steps, forwards
// and backwards, buckets, ZeRO's collectives and recomputations above the kernels they launched. NVTX 3 is
// header-only: with no profiler attached a range costs a call through a pointer that does nothing; under the
// emulator no profiler ever attaches.
//
// Device time: a span's host interval says when the host queued its work; the device runs that work later, when
// the stream reaches it. So each span also records an event on its stream where it starts and one where it ends,
// and the trace shows the interval between them on a track per stream ("device 0: compute stream"): a forward's
// host span is over in a millisecond while its device span is as long as its kernels take.
//   - The stream: the thread's innermost TraceStream if it has one (the NCCL process group's communication
//     stream), else the current device's compute stream, if this process has used the device (a CPU run of an
//     emulated build has none) and the thread is timed (trace::set_device_timing). None while it is captured into
//     a CUDA graph: a captured record would time a replay, not this span.
//   - The clock: events only measure elapsed time between two events. At the first mark of a trace on a device a
//     reference event is recorded on the span's stream and waited for, and the trace's clock read; a span starts
//     at that reading plus the elapsed time from the reference to its start event (events on any stream of a
//     device share its clock). Only that stream's queued work is waited for, not the device's (a collective in
//     flight on another stream may wait for a peer). The host reads its clock a few microseconds after the
//     reference completes, so device spans may sit that much late; cudaEventElapsedTime's
//     float keeps the placement to about 2^-24 of the time since the trace started (0.2 ms after an hour), the
//     duration (from the span's own pair) to its 0.5 us resolution.
//   - The cost: two event records per span; events are pooled, and read in batches (core/trace.cpp).
#include <nvtx3/nvToolsExt.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/trace.h"

namespace minidl::cuda {

namespace {

thread_local const TraceStream* t_stream = nullptr;  // this thread's innermost TraceStream

struct Mark {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  const char* track = nullptr;  // in Timer::tracks
};

struct Reference {
  cudaEvent_t event = nullptr;
  double trace_us = 0;  // the trace's clock when `event` had completed
};

struct Timer {
  std::mutex mu;
  std::map<int, std::vector<std::unique_ptr<Mark>>> free;  // marks read, by device: their events are reused
  std::map<int, Reference> references;                     // by device, for the current trace
  std::set<std::string> tracks;                            // the tracks' names (stable storage)
};

Timer& timer() {
  static Timer* t = new Timer;  // never destroyed: the runtime may be gone when static destructors run
  return *t;
}

const Reference& reference_locked(Timer& t, int device, cudaStream_t stream) {
  auto [it, added] = t.references.try_emplace(device);
  if (added) {
    MINIDL_CUDA_CHECK(cudaEventCreate(&it->second.event));
    MINIDL_CUDA_CHECK(cudaEventRecord(it->second.event, stream));
    MINIDL_CUDA_CHECK(cudaEventSynchronize(it->second.event));
    it->second.trace_us = trace::now_us();
  }
  return it->second;
}

void* begin_mark(bool thread_timed) {
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string track;
  if (t_stream) {
    stream = t_stream->stream;
    device = t_stream->device;
    track = "device " + std::to_string(device) + ": " + t_stream->name;
  } else {
    if (!thread_timed || cudaGetDevice(&device) != cudaSuccess) return nullptr;
    stream = existing_stream(device);
    if (stream == nullptr) return nullptr;
    track = "device " + std::to_string(device) + ": compute stream";
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MINIDL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;

  DeviceGuard guard(device);
  Timer& t = timer();
  std::unique_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    reference_locked(t, device, stream);
    auto& pool = t.free[device];
    if (!pool.empty()) {
      mark = std::move(pool.back());
      pool.pop_back();
    }
    if (!mark) {
      mark = std::make_unique<Mark>();
      MINIDL_CUDA_CHECK(cudaEventCreate(&mark->start));
      MINIDL_CUDA_CHECK(cudaEventCreate(&mark->end));
    }
    mark->track = t.tracks.insert(track).first->c_str();
  }
  mark->device = device;
  mark->stream = stream;
  MINIDL_CUDA_CHECK(cudaEventRecord(mark->start, stream));
  return mark.release();
}

void end_mark(void* opaque) {
  const Mark* mark = static_cast<const Mark*>(opaque);
  DeviceGuard guard(mark->device);
  MINIDL_CUDA_CHECK(cudaEventRecord(mark->end, mark->stream));
}

bool read_mark(void* opaque, bool wait, double* start_us, double* end_us, const char** track) {
  Mark* mark = static_cast<Mark*>(opaque);
  DeviceGuard guard(mark->device);
  if (wait) {
    MINIDL_CUDA_CHECK(cudaEventSynchronize(mark->end));
  } else if (const cudaError_t status = cudaEventQuery(mark->end); status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it, as every poller of CUDA events does
    return false;
  } else {
    MINIDL_CUDA_CHECK(status);
  }
  Timer& t = timer();
  std::lock_guard<std::mutex> lock(t.mu);
  const Reference& ref = t.references.at(mark->device);
  float from_reference_ms = 0, duration_ms = 0;
  MINIDL_CUDA_CHECK(cudaEventElapsedTime(&from_reference_ms, ref.event, mark->start));
  MINIDL_CUDA_CHECK(cudaEventElapsedTime(&duration_ms, mark->start, mark->end));
  *start_us = ref.trace_us + 1e3 * double(from_reference_ms);
  *end_us = *start_us + 1e3 * double(duration_ms);
  *track = mark->track;
  t.free[mark->device].emplace_back(mark);
  return true;
}

void restart() {
  Timer& t = timer();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto& [device, ref] : t.references) (void)cudaEventDestroy(ref.event);
  t.references.clear();
}

}  // namespace

TraceStream::TraceStream(cudaStream_t stream, int device, const char* name)
    : stream(stream), device(device), name(name), outer_(t_stream) {
  t_stream = this;
}

TraceStream::~TraceStream() { t_stream = outer_; }

void install_trace_hooks() {
  trace::set_range_hooks({[](const char* name) { nvtxRangePushA(name); }, [] { nvtxRangePop(); }});
  static std::once_flag once;  // before any trace starts: install_backend() runs at static initialisation
  std::call_once(once, [] { trace::set_device_timer({begin_mark, end_mark, read_mark, restart}); });
}

}  // namespace minidl::cuda
