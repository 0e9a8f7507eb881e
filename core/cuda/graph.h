// cuda::Graph: capture the work queued on a device's compute stream once and replay it with one launch (CUDA
// graphs), with the caching allocator's blocks of the capture kept in a pool of the graph's own.
//
//   cuda::Graph graph(0);
//   step();                       // eager warm-up: the allocator caches every size the step asks for
//   graph.capture([&] { step(); });   // recorded, not run
//   for (...) { refill_inputs(); graph.replay(); }   // one cudaGraphLaunch each, no host work per kernel
//
// What a replay does is fixed at capture: kernels, their arguments and every pointer. Anything that must change
// from one replay to the next (inputs, a step count, a learning rate) must live in device memory that the
// captured work reads, and be written before replay() on the same stream. Inside capture() the work must not
// synchronise, read back or copy from pageable host memory, and must not need a new cudaMalloc: on a GPU and on
// the emulator (cuda_emu/graph.h) such a call fails, and capture() throws naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace minidl::cuda {

class Graph {
 public:
  explicit Graph(int device);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs `work` with current_stream(device) capturing (global mode) and the allocator in this graph's pool, then
  // instantiates the graph. Throws (with the capture ended and nothing instantiated) if `work` throws or made a
  // call that cannot be captured. Once per Graph.
  void capture(const std::function<void()>& work);
  // Launches the captured work on current_stream(device): counted as one graph launch (cuda::counters()).
  void replay();
  bool captured() const { return exec_ != nullptr; }
  int device() const { return device_; }

 private:
  int device_;
  uint64_t pool_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace minidl::cuda
