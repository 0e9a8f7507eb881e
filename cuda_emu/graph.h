// graph.h — stream capture and CUDA graphs in the emulator (included by emulator.h; the runtime entry points,
// cudaStreamBeginCapture ... cudaGraphLaunch, are the toolkit's own declarations, implemented in graph.cpp).
//
// Between cudaStreamBeginCapture(s) and cudaStreamEndCapture(s), the work queued on s is recorded, not run:
// kernel launches (launch_kernel), cudaMemsetAsync, cudaMemcpyAsync between device buffers or from/to page-locked
// host memory, and host-side library work that a GPU would run on the stream (the emulated GEMM, through
// enqueue below). cudaGraphInstantiate copies the recorded list; each cudaGraphLaunch runs it in order, with the
// arguments as they were at capture (the pointers, not the data behind them: a replay reads the buffers' current
// contents). As on a GPU, while a capture is active a call that would synchronise or that cannot be captured is
// refused with cudaErrorStreamCaptureUnsupported and invalidates the capture (cudaStreamEndCapture then returns
// cudaErrorStreamCaptureInvalidated and no graph): cudaStreamSynchronize of the capturing stream,
// cudaDeviceSynchronize, cudaEventSynchronize, cudaMalloc/cudaFree/cudaMallocHost/cudaFreeHost, and a
// cudaMemcpy(Async) that touches pageable host memory. Not modelled: other streams joining a capture through
// events (work on another stream is not captured; an event record or wait on the capturing stream orders nothing),
// graph updates (cudaGraphExecUpdate), conditional nodes. With deferred streams a graph launch is one queued
// operation of its stream.
// A kernel's launch configuration is checked when the graph runs, not at capture.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace minidl::emu {

// True while `stream` is capturing (the legacy and per-thread default streams never are).
bool is_capturing(cudaStream_t stream);

// True when work queued on `stream` does not run at once: while it is capturing, or with deferred streams
// (MINIDL_EMU_STREAMS=async, emulator.h).
bool defers(cudaStream_t stream);

// Runs `work` now, or, while `stream` is capturing, records it to run at each launch of the graph, or, with
// deferred streams, queues it on the stream. What host code that stands in for a GPU library call on a stream (the
// emulated cuBLAS and NCCL) uses so that a capture records it and a deferred stream orders it. `work` must own
// what it reads from the host: it may run later, on another host thread.
cudaError_t enqueue(cudaStream_t stream, std::function<cudaError_t()> work);

namespace detail {
// For calls that are illegal while any capture is active: invalidates every active capture and returns
// cudaErrorStreamCaptureUnsupported (recorded as the last error), or cudaSuccess when none is active.
cudaError_t refuse_during_capture();
// The same for a call on `stream` only (cudaStreamSynchronize of a capturing stream).
cudaError_t refuse_if_capturing(cudaStream_t stream);
}  // namespace detail

}  // namespace minidl::emu
