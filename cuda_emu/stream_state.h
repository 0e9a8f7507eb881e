// The emulator's stream and event objects and its stream queues (internal to cuda_emu: runtime.cpp, graph.cpp and
// streams.cpp). In sync mode work runs when it is queued, and a stream only carries its capture state (graph.h).
// In async mode (launch.h: Options::streams, MINIDL_EMU_STREAMS=async) each stream has a queue of deferred work
// that runs only when something waits for it (streams.cpp explains when and in which order).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

struct CUgraph_st;

namespace minidl::emu::detail {
struct Queue;  // a stream's deferred work (streams.cpp)
}

struct CUstream_st {
  CUgraph_st* capture = nullptr;                      // the graph being captured into; null: not capturing
  bool capture_invalidated = false;                   // a call illegal during capture was made: EndCapture fails
  std::shared_ptr<minidl::emu::detail::Queue> queue;  // made by cudaStreamCreate*
};

// What a record leaves in an event. Shared with the queued record, which may run after the event is destroyed.
struct EventState {
  std::shared_ptr<minidl::emu::detail::Queue> queue;  // where the latest record was queued; null: never queued
  uint64_t seq = 0;                                   // that record's place in its queue
  std::chrono::steady_clock::time_point time;         // when the latest record ran
  bool recorded = false;                              // the latest record has run
};

struct CUevent_st {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace minidl::emu::detail {

// A stream's queue; the legacy default stream (null, cudaStreamLegacy) and cudaStreamPerThread share one.
// `blocking` is false for cudaStreamNonBlocking, which does not synchronise with the legacy stream.
std::shared_ptr<Queue> make_queue(bool blocking);

// Runs `work` on `stream` in stream order: now (sync mode), or queued (async mode). Not for a capturing stream.
cudaError_t submit(cudaStream_t stream, std::function<cudaError_t()> work);

// cudaEventRecord (on a capturing stream it stamps the host time, as in sync mode) and cudaStreamWaitEvent
// outside capture.
cudaError_t record_event(CUevent_st* event, cudaStream_t stream);
cudaError_t wait_event(cudaStream_t stream, const CUevent_st* event);

// Run what the named work needs, then return its first error (cudaSuccess when none).
cudaError_t synchronize_stream(cudaStream_t stream);     // everything queued on `stream` so far
cudaError_t synchronize_event(const CUevent_st* event);  // up to the event's latest record
cudaError_t synchronize_device();                        // everything queued on every stream

// The time of the event's latest record: cudaErrorNotReady while it is queued and has not run,
// cudaErrorInvalidResourceHandle if the event was never recorded.
cudaError_t event_time(const CUevent_st* event, std::chrono::steady_clock::time_point* time);

}  // namespace minidl::emu::detail
