// CUDA graph capture and replay (contract in core/cuda/graph.h).
#include "core/cuda/graph.h"

#include "core/cuda/cuda.h"

namespace minidl::cuda {

Graph::Graph(int device) : device_(device), pool_(new_graph_pool()) {}

Graph::~Graph() {
  if (exec_) (void)cudaGraphExecDestroy(exec_);
  if (graph_) (void)cudaGraphDestroy(graph_);
  // Blocks a replay still uses are reused only by later work on the same stream, after it in stream order.
  release_graph_pool(device_, pool_);
}

void Graph::capture(const std::function<void()>& work) {
  MINIDL_CHECK(!captured(), "cuda::Graph::capture: this graph was already captured");
  DeviceGuard guard(device_);
  cudaStream_t stream = current_stream(device_);
  MINIDL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  begin_graph_pool(device_, pool_);
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    end_graph_pool(device_);
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  end_graph_pool(device_);
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  MINIDL_CHECK(ended == cudaSuccess, "cuda::Graph::capture: the capture on cuda:", device_, " failed (",
               cudaGetErrorName(ended),
               "): the captured work made a call that cannot be captured (a synchronisation, "
               "a read back, a copy from pageable host memory or a cudaMalloc)");
  graph_ = graph;
  MINIDL_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void Graph::replay() {
  MINIDL_CHECK(captured(), "cuda::Graph::replay: nothing was captured");
  DeviceGuard guard(device_);
  MINIDL_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream(device_)));
  detail::count_graph_launch();
}

}  // namespace minidl::cuda
