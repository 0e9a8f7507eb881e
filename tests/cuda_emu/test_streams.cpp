// Deferred streams (MINIDL_EMU_STREAMS=async, cuda_emu/streams.cpp): work on different streams is ordered only by
// events and synchronisation, so a missing cudaStreamWaitEvent gives a wrong result every time; with synchronous
// streams (the default) the same code cannot fail.
#include <thread>
#include <vector>

#include "support.h"

namespace emu_test {
namespace {

// y[i] = x[i]
__global__ void copy_kernel(const float* x, float* y, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = x[i];
}

constexpr int kN = 300;

minidl::emu::Options with_streams(minidl::emu::StreamMode mode) {
  minidl::emu::Options o = minidl::emu::options();
  o.streams = mode;
  return o;
}

class Streams : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&consumer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaEventDestroy(written_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(consumer_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(producer_), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

  // The producer turns x from 1 into 3; the consumer copies x into y, after waiting for the producer or not.
  void produce_and_consume(float* x, float* y, bool wait) {
    ASSERT_EQ(launch_kernel(affine_kernel, (kN + 127) / 128, 128, 0, producer_, x, 2.0f, 1.0f, kN), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(written_, producer_), cudaSuccess);
    if (wait) { ASSERT_EQ(cudaStreamWaitEvent(consumer_, written_, 0), cudaSuccess); }
    ASSERT_EQ(launch_kernel(copy_kernel, (kN + 127) / 128, 128, 0, consumer_, x, y, kN), cudaSuccess);
  }

  cudaStream_t producer_ = nullptr, consumer_ = nullptr;
  cudaEvent_t written_ = nullptr;
};

TEST_F(Streams, AWaitedEventOrdersTheConsumerAfterTheProducer) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f)), y(std::vector<float>(kN, 0.0f));
  produce_and_consume(x.get(), y.get(), true);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<float>(kN, 3.0f));
}

TEST_F(Streams, WithoutTheWaitTheConsumerReadsTheOldValue) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f)), y(std::vector<float>(kN, 0.0f));
  produce_and_consume(x.get(), y.get(), false);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<float>(kN, 1.0f));  // the bug, caught
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  EXPECT_EQ(x.host(), std::vector<float>(kN, 3.0f));
}

// Synchronising the device runs the streams not waited on first too (newest first): the consumer still wins.
TEST_F(Streams, WithoutTheWaitADeviceSynchronizeStillRunsTheConsumerFirst) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f)), y(std::vector<float>(kN, 0.0f));
  produce_and_consume(x.get(), y.get(), false);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<float>(kN, 1.0f));
  EXPECT_EQ(x.host(), std::vector<float>(kN, 3.0f));
}

TEST_F(Streams, SynchronousStreamsCannotCatchTheMissingWait) {
  ScopedOptions sync(with_streams(minidl::emu::StreamMode::kSync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f)), y(std::vector<float>(kN, 0.0f));
  produce_and_consume(x.get(), y.get(), false);
  EXPECT_EQ(y.host(), std::vector<float>(kN, 3.0f));
}

// Emulated device memory is host memory, so the host can look at it without synchronising: nothing has run.
TEST_F(Streams, QueuedWorkRunsOnlyWhenWaitedFor) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f));
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 1.0f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written_, producer_), cudaSuccess);
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 10.0f, 0.0f, kN), cudaSuccess);
  EXPECT_EQ(x.get()[0], 1.0f);
  ASSERT_EQ(cudaEventSynchronize(written_), cudaSuccess);  // up to the record, not beyond
  EXPECT_EQ(x.get()[0], 2.0f);
  ASSERT_EQ(cudaEventQuery(written_), cudaSuccess);
  EXPECT_EQ(x.get()[0], 2.0f);
  ASSERT_EQ(cudaStreamQuery(producer_), cudaSuccess);  // a query runs the stream: a polling loop ends
  EXPECT_EQ(x.get()[0], 20.0f);
}

// A launch with a bad configuration fails when it is queued, as on a GPU.
TEST_F(Streams, AQueuedLaunchReportsItsConfigurationErrorAtOnce) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  EXPECT_EQ(launch_kernel(affine_kernel, 1, 1025, 0, producer_, nullptr, 1.0f, 1.0f, 0), cudaErrorInvalidConfiguration);
}

// The legacy default stream waits for blocking streams (cudaStreamCreate) and they for it; a
// cudaStreamNonBlocking stream is ordered with neither, so cudaMemcpy does not wait for its kernels.
TEST_F(Streams, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f));
  std::vector<float> got(kN);
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, blocking, x.get(), 2.0f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), x.get(), kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, std::vector<float>(kN, 3.0f));
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 2.0f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), x.get(), kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, std::vector<float>(kN, 3.0f));  // not 7: nothing ordered the copy after the non-blocking stream
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  EXPECT_EQ(x.host(), std::vector<float>(kN, 7.0f));
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

// CUDA stages a copy from pageable host memory at the call (the host may reuse the buffer at once) and returns
// from a copy into pageable memory once it landed.
TEST_F(Streams, PageableHostMemoryIsCopiedAtTheCall) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 0.0f));
  std::vector<float> host(kN, 5.0f), back(kN, 0.0f);
  ASSERT_EQ(cudaMemcpyAsync(x.get(), host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, producer_), cudaSuccess);
  host.assign(kN, -1.0f);
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 1.0f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), x.get(), kN * sizeof(float), cudaMemcpyDeviceToHost, producer_), cudaSuccess);
  EXPECT_EQ(back, std::vector<float>(kN, 6.0f));
}

TEST_F(Streams, EventsTimeTheWorkWhenTheirRecordsRun) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  cudaEvent_t start = nullptr, stop = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f));
  ASSERT_EQ(cudaEventRecord(start, producer_), cudaSuccess);
  ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 1.0f, 1.0f, kN), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, producer_), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(stop), cudaSuccess);
}

// A wait pulls another host thread's stream: a consumer queued on this thread, a producer on another thread.
TEST_F(Streams, WorkQueuedFromAnotherThreadRunsWhenWaitedFor) {
  ScopedOptions async(with_streams(minidl::emu::StreamMode::kAsync));
  DeviceBuffer<float> x(std::vector<float>(kN, 1.0f)), y(std::vector<float>(kN, 0.0f));
  std::thread other([&] {
    ASSERT_EQ(launch_kernel(affine_kernel, 1, kN, 0, producer_, x.get(), 2.0f, 1.0f, kN), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(written_, producer_), cudaSuccess);
  });
  other.join();
  ASSERT_EQ(cudaStreamWaitEvent(consumer_, written_, 0), cudaSuccess);
  ASSERT_EQ(launch_kernel(copy_kernel, 1, kN, 0, consumer_, x.get(), y.get(), kN), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<float>(kN, 3.0f));
}

}  // namespace
}  // namespace emu_test
