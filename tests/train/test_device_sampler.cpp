// The training batch drawn on the device (data::DeviceBatchSampler, ops/sample_windows.h; issue #15): the split
// uploaded once, one kernel per step gathering the windows. Oracles: data::BatchSampler on the host (the same batch
// bit for bit, for several steps and slices), the steps on a host batch (the same losses and weights bit for bit,
// eager and under --cuda-graph) and the backend's counters (a steady-state step copies nothing either way, reads
// nothing back, waits for nothing and allocates nothing).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/cuda_test.h"
#include "core/tensor.h"
#include "nn/gpt.h"
#include "ops/sample_windows.h"
#include "optim/adamw.h"
#include "train/cuda_graph.h"
#include "train/step.h"
#include "train/tiny_batches.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);
const nn::GPTConfig kConfig{17, 8, 2, 2, 32, 0.0, true};  // vocab 17, block 8

class DeviceSampler : public testing::CudaTest {};

// A split of `len` tokens of the 17-token vocabulary, in no simple pattern.
std::vector<int32_t> split(int64_t len) {
  std::vector<int32_t> t(static_cast<size_t>(len));
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 7 + i / 5 + i * i % 11) % 17);
  return t;
}

std::vector<double> values(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

TEST_F(DeviceSampler, BatchEqualsTheHostSamplersBitForBit) {
  constexpr int64_t kBatch = 7;
  // len - seq = 1 (every window starts at 0), 2, and a split much longer than a window.
  for (const int64_t len : {9, 10, 300}) {
    const int64_t seq = 8;
    SCOPED_TRACE("len " + std::to_string(len));
    const std::vector<int32_t> tokens = split(len);
    data::BatchSampler host(tokens, seq, kBatch, 1337);
    data::DeviceBatchSampler device(tokens, seq, kBatch, 1337, kCuda);
    Tensor step_on_device = Tensor::zeros({1}, DType::i64, kCuda);
    // Slices: the whole batch, a ragged middle one (begin > 0, n = 3), the last sample alone.
    for (const auto& [begin, n] : std::vector<std::pair<int64_t, int64_t>>{{0, kBatch}, {2, 3}, {kBatch - 1, 1}})
      for (const int64_t step : {0, 1, 5, 123456}) {
        SCOPED_TRACE("step " + std::to_string(step) + " slice [" + std::to_string(begin) + ", " +
                     std::to_string(begin + n) + ")");
        const data::Batch want = host.batch(step, begin, n);
        data::Batch got = device.batch(step, begin, n);
        ASSERT_EQ(got.x.dtype(), DType::i64);
        ASSERT_TRUE(got.x.device() == kCuda);
        EXPECT_EQ(values(got.x), want.x.to_vector());
        EXPECT_EQ(values(got.y), want.y.to_vector());
        // The step read from the device when the kernel runs (a CUDA graph's way).
        step_on_device.fill_(double(step));
        got = device.batch(step_on_device, begin, n);
        EXPECT_EQ(values(got.x), want.x.to_vector());
        EXPECT_EQ(values(got.y), want.y.to_vector());
      }
  }
  // The CPU op gives the host sampler's batch too.
  const std::vector<int32_t> tokens = split(300);
  const data::Batch want = data::BatchSampler(tokens, 8, kBatch, 9).batch(4, 1, 5);
  Tensor x = Tensor::empty({5, 8}, DType::i64), y = Tensor::empty({5, 8}, DType::i64);
  ops::sample_windows_(Tensor::from_vector(tokens, {300}).to(DType::i32), 8,
                       {9, data::kSamplerStream, kBatch, 4, Tensor(), 1}, x, y);
  EXPECT_EQ(x.to_vector(), want.x.to_vector());
  EXPECT_EQ(y.to_vector(), want.y.to_vector());
}

std::string message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) { return e.what(); }
  return "no error";
}

// A token outside the vocabulary is refused when the split is uploaded, with GPT::check_ids' message; a slice
// outside the global batch by name.
TEST_F(DeviceSampler, RefusesBadSplitsAndSlices) {
  nn::GPT model(kConfig, 1);
  model.to(kCuda);
  std::vector<int32_t> tokens = split(100);
  tokens[42] = 17;
  const std::string bad = message([&] { train::device_sampler(model, tokens, 8, 4, 1); });
  EXPECT_NE(bad.find("token ids of the training split must lie in [0, vocab_size = 17), got 17 at flat index 42"),
            std::string::npos)
      << bad;
  tokens[42] = 3;
  data::DeviceBatchSampler ok = train::device_sampler(model, tokens, 8, 4, 1);
  EXPECT_NE(message([&] { ok.batch(0, 2, 3); }).find("slice [2, 5)"), std::string::npos);
  EXPECT_NE(message([&] { data::DeviceBatchSampler(tokens, 8, 4, 1, Device::cpu()); }).find("CUDA device"),
            std::string::npos);
}

struct Outcome {
  std::vector<double> losses, weights;
};

// `steps` steps of a tiny GPT on samples [1, 3) of a global batch of 4: from the host sampler's batches (uploaded
// by the step), from a DeviceBatchSampler eagerly, or from it under a CUDA graph. Dropout on, so the step's masks
// must follow as well.
enum class Source { kHost, kDevice, kDeviceGraph };
Outcome run(Source source, int steps) {
  nn::GPTConfig config = kConfig;
  config.dropout = 0.1;
  nn::GPT model(config, 1337);
  model.to(kCuda);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  train::StepOptions o;
  o.grad_clip = 0.05;
  o.read_back = false;
  o.micro_batches = 2;
  const std::vector<int32_t> tokens = split(200);
  data::BatchSampler host(tokens, 8, 4, 7);
  data::DeviceBatchSampler device = train::device_sampler(model, tokens, 8, 4, 7);
  std::unique_ptr<train::CudaGraphStep> graph;
  if (source == Source::kDeviceGraph) graph = std::make_unique<train::CudaGraphStep>(model, opt, o);
  Outcome out;
  for (int s = 0; s < steps; ++s) {
    o.lr = 1e-3 * (1.0 + 0.25 * s);
    train::StepResult r = source == Source::kHost ? train::train_step(model, opt, host.batch(s, 1, 2), o)
                          : graph                 ? graph->step(device, s, 1, 2, o.lr)
                                                  : train::train_step(model, opt, device, s, 1, 2, o);
    r.read();
    out.losses.push_back(r.loss);
  }
  out.weights = testing::weights(model);
  return out;
}

TEST_F(DeviceSampler, StepsEqualTheHostBatchesStepsEagerAndReplayed) {
  const int steps = 6;  // under the graph: 2 eager, 1 captured, 3 more replays
  const Outcome host = run(Source::kHost, steps), device = run(Source::kDevice, steps),
                graph = run(Source::kDeviceGraph, steps);
  EXPECT_EQ(device.losses, host.losses);
  EXPECT_EQ(device.weights, host.weights);
  EXPECT_EQ(graph.losses, host.losses);
  EXPECT_EQ(graph.weights, host.weights);
  EXPECT_NE(host.losses.front(), host.losses.back());
}

// A steady-state step on a device-drawn batch: no host synchronisation, no copy either way, no cudaMalloc; eager
// and replayed (one graph launch and two fills: the learning rate and the sampler's step).
TEST_F(DeviceSampler, SteadyStateStepCopiesNothing) {
  for (const bool use_graph : {false, true}) {
    SCOPED_TRACE(use_graph ? "--cuda-graph" : "eager");
    nn::GPT model(kConfig, 1337);
    model.to(kCuda);
    model.train();
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
    train::StepOptions o;
    o.read_back = false;
    data::DeviceBatchSampler device = train::device_sampler(model, split(200), 8, 2, 7);
    std::unique_ptr<train::CudaGraphStep> graph;
    if (use_graph) graph = std::make_unique<train::CudaGraphStep>(model, opt, o);
    auto step = [&](int s) {
      return graph ? graph->step(device, s, 0, 2, o.lr) : train::train_step(model, opt, device, s, 0, 2, o);
    };
    for (int s = 0; s < 4; ++s) step(s);  // warm caches; under the graph: 2 eager, 1 captured and replayed, 1 more
    const cuda::Counters before = cuda::counters();
    train::StepResult r = step(4);
    const cuda::Counters c = cuda::counters() - before;
    EXPECT_EQ(c.h2d_copies, 0);
    EXPECT_EQ(c.d2h_copies, 0);
    EXPECT_EQ(c.host_syncs, 0);
    EXPECT_EQ(c.device_mallocs, 0);
    if (use_graph) {
      EXPECT_EQ(c.graph_launches, 1);
      EXPECT_EQ(c.kernel_launches, 2);  // the learning rate's and the sampler step's fills, outside the graph
    }
    r.read();
    EXPECT_TRUE(std::isfinite(r.loss));
  }
}

}  // namespace
}  // namespace minidl
