// Stream capture and CUDA graphs (contract in cuda_emu/graph.h).
#include "cuda_emu/graph.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda_emu/stream_state.h"

namespace minidl::emu::detail {
void set_last_error(cudaError_t error);
}

// The recorded work of one capture, in stream order.
struct CUgraph_st {
  std::vector<std::function<cudaError_t()>> nodes;
};
struct CUgraphExec_st {
  // Shared with each launch, which a deferred stream may run after cudaGraphExecDestroy.
  std::shared_ptr<const std::vector<std::function<cudaError_t()>>> nodes;
};

namespace minidl::emu {
namespace {

// Streams capturing now; a call that is illegal during capture invalidates them all (global capture mode).
std::mutex captures_mutex;
std::vector<cudaStream_t>& active_captures() {
  static std::vector<cudaStream_t> streams;
  return streams;
}
std::atomic<int> active_count{0};

// The handles cudaStreamLegacy (1) and cudaStreamPerThread (2) and the null stream are not CUstream_st objects.
bool is_object(cudaStream_t stream) { return reinterpret_cast<uintptr_t>(stream) > 2; }

cudaError_t fail(cudaError_t error) {
  detail::set_last_error(error);
  return error;
}

}  // namespace

bool is_capturing(cudaStream_t stream) {
  return active_count.load(std::memory_order_acquire) > 0 && is_object(stream) && stream->capture != nullptr;
}

cudaError_t enqueue(cudaStream_t stream, std::function<cudaError_t()> work) {
  if (!is_capturing(stream)) return detail::submit(stream, std::move(work));
  stream->capture->nodes.push_back(std::move(work));
  return cudaSuccess;
}

namespace detail {

cudaError_t refuse_during_capture() {
  if (active_count.load(std::memory_order_acquire) == 0) return cudaSuccess;
  std::lock_guard lock(captures_mutex);
  for (cudaStream_t s : active_captures()) s->capture_invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

cudaError_t refuse_if_capturing(cudaStream_t stream) {
  if (!is_capturing(stream)) return cudaSuccess;
  stream->capture_invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace detail
}  // namespace minidl::emu

using minidl::emu::fail;
using minidl::emu::is_object;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (!is_object(stream)) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
  std::lock_guard lock(minidl::emu::captures_mutex);
  stream->capture = new CUgraph_st;
  stream->capture_invalidated = false;
  minidl::emu::active_captures().push_back(stream);
  minidl::emu::active_count.fetch_add(1, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  if (!is_object(stream) || stream->capture == nullptr) return fail(cudaErrorIllegalState);
  std::lock_guard lock(minidl::emu::captures_mutex);
  std::vector<cudaStream_t>& active = minidl::emu::active_captures();
  std::erase(active, stream);
  minidl::emu::active_count.fetch_sub(1, std::memory_order_release);
  CUgraph_st* captured = std::exchange(stream->capture, nullptr);
  if (std::exchange(stream->capture_invalidated, false)) {
    delete captured;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = captured;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  *status = !is_object(stream) || stream->capture == nullptr ? cudaStreamCaptureStatusNone
            : stream->capture_invalidated                    ? cudaStreamCaptureStatusInvalidated
                                                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{std::make_shared<const std::vector<std::function<cudaError_t()>>>(graph->nodes)};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // Captured into another graph, it becomes one node of that graph.
  return minidl::emu::enqueue(stream, [nodes = exec->nodes] {
    for (const auto& node : *nodes)
      if (const cudaError_t status = node(); status != cudaSuccess) return status;
    return cudaSuccess;
  });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete graph;
  return cudaSuccess;
}
