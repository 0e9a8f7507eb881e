// Stream capture and CUDA graphs in the emulator (cuda_emu/graph.h): captured work runs only at a graph launch, in
// stream order, on the buffers' contents at launch time, with the same results as running it directly; calls that
// cannot be captured fail and invalidate the capture, as on a GPU.
#include <cmath>
#include <numeric>
#include <vector>

#include "support.h"

namespace emu_test {
namespace {

// y[i] += x[i] * x[(i + 1) % n]: reads a neighbour another block may own, so it needs the previous kernel done.
__global__ void mix_kernel(const float* x, float* y, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] += x[i] * x[(i + 1) % n];
}

constexpr int kN = 1000;

// The work under test: a memset, a device-to-device copy and two kernels whose order matters, all on `s`.
void queue_work(float* in, float* tmp, float* out, cudaStream_t s) {
  ASSERT_EQ(cudaMemsetAsync(out, 0, kN * sizeof(float), s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(tmp, in, kN * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(launch_kernel(affine_kernel, (kN + 127) / 128, 128, 0, s, tmp, 0.5f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(launch_kernel(mix_kernel, (kN + 63) / 64, 64, 0, s, tmp, out, kN), cudaSuccess);
  ASSERT_EQ(launch_kernel(affine_kernel, (kN + 127) / 128, 128, 0, s, out, -2.0f, 0.25f, kN), cudaSuccess);
}

std::vector<float> inputs(float shift) {
  std::vector<float> v(kN);
  for (int i = 0; i < kN; ++i) v[size_t(i)] = std::sin(0.01f * float(i)) + shift;
  return v;
}

class Capture : public testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess); }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(Capture, GraphLaunchEqualsDirectExecutionAndRunsNothingAtCapture) {
  DeviceBuffer<float> in(inputs(0.0f)), tmp(kN), out(std::vector<float>(kN, 42.0f));
  DeviceBuffer<float> in_ref(inputs(0.0f)), tmp_ref(kN), out_ref(kN);
  queue_work(in_ref.get(), tmp_ref.get(), out_ref.get(), stream_);  // direct

  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  queue_work(in.get(), tmp.get(), out.get(), stream_);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(out.host(), std::vector<float>(kN, 42.0f));  // recorded, not run

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(out.host(), out_ref.host());  // bitwise: the same kernels in the same order

  // A replay reads the buffers as they are now: new inputs, same graph.
  const std::vector<float> next = inputs(0.75f);
  ASSERT_EQ(cudaMemcpy(in.get(), next.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in_ref.get(), next.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  queue_work(in_ref.get(), tmp_ref.get(), out_ref.get(), stream_);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(out.host(), out_ref.host());
  EXPECT_NE(out.host(), std::vector<float>(kN, 42.0f));

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(Capture, EnqueuedHostWorkIsRecordedToo) {
  std::vector<int> order;
  ASSERT_EQ(minidl::emu::enqueue(stream_,
                                 [&] {
                                   order.push_back(0);
                                   return cudaSuccess;
                                 }),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);  // with deferred streams it runs only now
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_TRUE(minidl::emu::is_capturing(stream_));
  ASSERT_EQ(minidl::emu::enqueue(stream_,
                                 [&] {
                                   order.push_back(1);
                                   return cudaSuccess;
                                 }),
            cudaSuccess);
  ASSERT_EQ(minidl::emu::enqueue(stream_,
                                 [&] {
                                   order.push_back(2);
                                   return cudaSuccess;
                                 }),
            cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_FALSE(minidl::emu::is_capturing(stream_));
  EXPECT_EQ(order, std::vector<int>{0});
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 1, 2}));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// Each call that a GPU refuses during a global-mode capture: it fails with cudaErrorStreamCaptureUnsupported, and
// the capture ends with cudaErrorStreamCaptureInvalidated and no graph.
TEST_F(Capture, UncapturableCallsInvalidateTheCapture) {
  std::vector<float> pageable(kN, 1.0f);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kN * sizeof(float)), cudaSuccess);
  DeviceBuffer<float> dev(kN);
  struct Case {
    const char* name;
    std::function<cudaError_t()> call;
  };
  const std::vector<Case> cases = {
      {"cudaStreamSynchronize", [&] { return cudaStreamSynchronize(stream_); }},
      {"cudaDeviceSynchronize", [&] { return cudaDeviceSynchronize(); }},
      {"cudaMalloc",
       [&] {
         void* p = nullptr;
         return cudaMalloc(&p, 64);
       }},
      {"cudaMemcpy", [&] { return cudaMemcpy(dev.get(), pinned, 64, cudaMemcpyHostToDevice); }},
      {"pageable cudaMemcpyAsync",
       [&] { return cudaMemcpyAsync(dev.get(), pageable.data(), 64, cudaMemcpyHostToDevice, stream_); }},
      {"pageable device-to-host cudaMemcpyAsync",
       [&] { return cudaMemcpyAsync(pageable.data(), dev.get(), 64, cudaMemcpyDeviceToHost, stream_); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(c.call(), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
    EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    (void)cudaGetLastError();
  }
  // A copy from page-locked memory is captured; it reads the pinned buffer when the graph runs.
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dev.get(), pinned, kN * sizeof(float), cudaMemcpyHostToDevice, stream_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::iota(pinned, pinned + kN, 0.0f);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);  // cudaMemcpy does not wait for a non-blocking stream
  std::vector<float> expected(kN);
  std::iota(expected.begin(), expected.end(), 0.0f);
  EXPECT_EQ(dev.host(), expected);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  // Outside a capture everything works again; the legacy stream cannot capture.
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace emu_test
