// cuda::Graph (core/cuda/graph.h): a captured sequence of tensor ops replays with one graph launch and gives the
// eager result bit for bit, on inputs refreshed in place before each replay; the caching allocator keeps the
// capture's blocks in the graph's own pool; a capture that would need a cudaMalloc or a host read fails by name.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test.h"
#include "core/cuda/graph.h"
#include "core/tensor.h"
#include "core/upload.h"
#include "ops/elementwise.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);

class CudaGraph : public testing::CudaTest {};

// out = (x * x + x) * x, through temporaries the allocator hands out and takes back
Tensor work(const Tensor& x) { return ops::mul(ops::add(ops::mul(x, x), x), x); }

Tensor host_values(int k) {
  std::vector<float> v(257);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(i) - float(k);
  return Tensor::from_vector(v, {257});
}

TEST_F(CudaGraph, ReplayEqualsEagerWithOneLaunchAndNoAllocation) {
  const Tensor half = Tensor::scalar(0.5).to(kCuda);
  auto step = [&](const Tensor& x) { return ops::mul(ops::add(ops::mul(x, x), x), half); };
  Tensor input = Tensor::empty({257}, DType::f32, kCuda);  // the graph's static input
  upload_async(input, host_values(0));
  Tensor output;
  step(input);  // warm-up: every size the capture asks for is cached
  cuda::Graph graph(0);
  const cuda::Counters before_capture = cuda::counters();
  graph.capture([&] { output = step(input); });
  EXPECT_EQ((cuda::counters() - before_capture).device_mallocs, 0);
  ASSERT_TRUE(graph.captured());
  for (int k = 1; k <= 3; ++k) {
    upload_async(input, host_values(k));
    const cuda::Counters before = cuda::counters();
    graph.replay();
    const cuda::Counters c = cuda::counters() - before;
    EXPECT_EQ(c.graph_launches, 1);
    EXPECT_EQ(c.kernel_launches, 0);  // the replay's kernels are the graph's, not launched one by one
    EXPECT_EQ(c.device_mallocs + c.host_syncs + c.h2d_copies + c.d2h_copies, 0);
    const Tensor eager = step(host_values(k).to(kCuda));
    EXPECT_EQ(output.to_vector(), eager.to_vector()) << "replay " << k;
  }
}

TEST_F(CudaGraph, CapturedBlocksStayTheGraphs) {
  Tensor x = Tensor::ones({1000}, DType::f32, kCuda);
  Tensor warm = work(x);
  warm = Tensor();
  cuda::Graph graph(0);
  Tensor out;
  graph.capture([&] { out = work(x); });
  const void* graph_out = out.raw_device_data();
  out = Tensor();  // freed after the capture: back to the graph's pool, not the shared cache
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) {  // every block of that size the shared cache has, and new ones
    others.push_back(Tensor::empty({1000}, DType::f32, kCuda));
    EXPECT_NE(others.back().raw_device_data(), graph_out);
  }
}

TEST_F(CudaGraph, UncapturableWorkThrowsByName) {
  Tensor x = Tensor::ones({64}, DType::f32, kCuda);
  cuda::Graph reads_back(0);
  try {
    reads_back.capture([&] { (void)x.to_vector(); });  // a device -> host copy into pageable memory, then a wait
    ADD_FAILURE() << "a read back was captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorStreamCapture"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(reads_back.captured());
  cuda::Graph uploads(0);
  Tensor in = Tensor::empty({64}, DType::f32, kCuda);
  try {
    uploads.capture([&] { upload_async(in, Tensor::ones({64})); });  // would be stale at every replay
    ADD_FAILURE() << "an upload was captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input tensors before each replay"), std::string::npos) << e.what();
  }
  cuda::Graph cold(0);
  try {
    cold.capture([&] { (void)Tensor::empty({12345, 7}, DType::f32, kCuda); });  // a size never cached
    ADD_FAILURE() << "an allocation that needs cudaMalloc was captured";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("warm-up"), std::string::npos) << e.what(); }
  // Nothing is left capturing: eager work runs again.
  EXPECT_EQ(ops::add(x, x).to_vector(), std::vector<double>(64, 2.0));
}

}  // namespace
}  // namespace minidl
