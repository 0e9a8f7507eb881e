// A trace's device time (core/cuda/trace_hooks.cpp): each span also gets the interval its stream spent between
// the span's start and end, on the stream's own track. The oracle is work of known length that the host does not
// wait for: a host function that sleeps, queued on the stream. The host's span is over before the sleep starts;
// the device's span lasts the sleep, starts no earlier than the host's, and ends before the host's synchronisation
// returned.
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/trace.h"
#include "tests/core/cuda/cuda_test.h"

namespace minidl {
namespace {

using testing::CudaTest;

constexpr double kSleepMs = 30;
// The device clock is referred to the trace's by a reference event the host waits for: the host reads its clock
// a little after the event completed, so a device interval may sit that much late.
constexpr double kPlacementUs = 1000;

void sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(ms)));
}

struct Interval {
  double ts = 0, dur = 0;
  double end() const { return ts + dur; }
};

// Each span's intervals by track name, then span name.
std::map<std::string, std::map<std::string, std::vector<Interval>>> read_tracks(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::map<int, std::string> names;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[e.at("tid")] = e.at("args").at("name");
  std::map<std::string, std::map<std::string, std::vector<Interval>>> tracks;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X") tracks[names[e.at("tid")]][e.at("name")].push_back({e.at("ts"), e.at("dur")});
  return tracks;
}

class TraceDevice : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    path_ = (std::filesystem::temp_directory_path() /
             ("minidl_trace_device_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
};

TEST_F(TraceDevice, SpanLastsItsStreamsWorkNotTheHosts) {
  cudaStream_t stream = cuda::current_stream(0);
  trace::name_thread("main");
  trace::start(path_, 0);
  // Later than the trace's start by more than the sleep: an interval not referred to the trace's clock shows.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double sleep_ms = kSleepMs;
  {
    const trace::Span span("sleep on the device");
    MINIDL_CUDA_CHECK(cudaLaunchHostFunc(stream, sleep_on_stream, &sleep_ms));
  }
  MINIDL_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double synchronized_us = trace::now_us();
  ASSERT_EQ(trace::finish(), path_);

  auto tracks = read_tracks(path_);
  ASSERT_EQ(tracks["main"]["sleep on the device"].size(), 1u);
  ASSERT_EQ(tracks["device 0: compute stream"]["sleep on the device"].size(), 1u)
      << "no device interval on the compute stream's track";
  const Interval host = tracks["main"]["sleep on the device"][0];
  const Interval device = tracks["device 0: compute stream"]["sleep on the device"][0];
  EXPECT_LT(host.dur, 1e3 * kSleepMs / 2) << "the host waited for the stream: the test proves nothing";
  EXPECT_GE(device.dur, 1e3 * kSleepMs - 1) << "the device interval is not the stream's work";
  EXPECT_LT(device.dur, 1e3 * kSleepMs + 20e3);
  EXPECT_GE(device.ts, host.ts - kPlacementUs) << "the device started the span before the host queued it";
  EXPECT_LE(device.end(), synchronized_us + kPlacementUs) << "the device ended after the host saw it end";
}

// A TraceStream times the spans in its scope on its stream's track, whatever the thread's setting; a thread that
// turned device timing off gets no device interval otherwise; a span whose stream is being captured into a graph
// gets none either.
TEST_F(TraceDevice, TraceStreamsUntimedThreadsAndCaptures) {
  (void)cuda::current_stream(0);
  cudaStream_t side = nullptr;
  MINIDL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  trace::start(path_, 0);
  double sleep_ms = 10;
  std::thread([&] {
    trace::name_thread("comm");
    trace::set_device_timing(false);
    { const trace::Span untimed("untimed"); }
    const cuda::TraceStream on(side, 0, "side stream");
    const trace::Span span("on the side");
    MINIDL_CUDA_CHECK(cudaLaunchHostFunc(side, sleep_on_stream, &sleep_ms));
  }).join();
  MINIDL_CUDA_CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal));
  {
    const cuda::TraceStream on(side, 0, "side stream");
    const trace::Span captured("captured");
  }
  cudaGraph_t graph = nullptr;
  MINIDL_CUDA_CHECK(cudaStreamEndCapture(side, &graph));
  if (graph) MINIDL_CUDA_CHECK(cudaGraphDestroy(graph));
  MINIDL_CUDA_CHECK(cudaStreamSynchronize(side));
  ASSERT_EQ(trace::finish(), path_);
  MINIDL_CUDA_CHECK(cudaStreamDestroy(side));

  auto tracks = read_tracks(path_);
  EXPECT_EQ(tracks["comm"]["untimed"].size(), 1u);
  EXPECT_EQ(tracks["comm"]["on the side"].size(), 1u);
  ASSERT_EQ(tracks["device 0: side stream"]["on the side"].size(), 1u) << "the TraceStream's span was not timed";
  EXPECT_GE(tracks["device 0: side stream"]["on the side"][0].dur, 1e3 * sleep_ms - 1);
  for (const auto& [track, spans] : tracks) {
    if (track.rfind("device", 0) != 0) continue;
    EXPECT_EQ(spans.count("untimed"), 0u) << "an untimed thread's span was timed on " << track;
    EXPECT_EQ(spans.count("captured"), 0u) << "a span in a capture was timed on " << track;
  }
}

}  // namespace
}  // namespace minidl
