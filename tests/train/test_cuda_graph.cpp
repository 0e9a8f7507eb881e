// train::CudaGraphStep (train/cuda_graph.h) on the emulated device: N steps replayed from one captured train_step
// give the eager train_step's losses and weights bit for bit (f32, and fp16 with a loss scaler, clipping on, a
// learning rate that changes every step; dropout, whose masks' step the replays read on the device, with gradient
// accumulation); a replayed step makes no host synchronisation, no read back, no
// cudaMalloc, exactly one graph launch and one kernel launch of its own (the learning rate's fill), and copies only
// the batch to the device; what a replay cannot change is refused. On a GPU (test_device_step_gpu, tests/gpu) the
// bitwise comparison holds because cuBLAS's workspace is pinned (ops/cuda/tensor/gemm_cublas.cpp): a captured
// product cannot choose another algorithm than the eager one.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/cuda_test.h"
#include "core/cuda/graph.h"
#include "core/tensor.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "train/cuda_graph.h"
#include "train/step.h"
#include "train/tiny_batches.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);
const nn::GPTConfig kConfig{17, 8, 2, 2, 32, 0.0, true};

class CudaGraphStep : public testing::CudaTest {};

// Step s's batch: ids shifted by 3s, targets by s.
data::Batch batch_for(int step) { return testing::tiny_batch(2, 3 * step, step); }

using testing::weights;

struct Outcome {
  std::vector<double> losses, norms;
  std::vector<double> weights;
  int64_t adam_step = 0;
};

Outcome run_steps(bool graph, bool fp16, int steps, double dropout = 0.0, int64_t grad_accum = 1) {
  nn::GPTConfig config = kConfig;
  config.dropout = dropout;
  nn::GPT model(config, 1337);
  model.to(kCuda);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  optim::GradScaler scaler;
  train::StepOptions o;
  o.grad_clip = 0.05;  // below the norm: the clip is applied
  if (fp16) o.amp = DType::f16, o.scaler = &scaler;
  o.micro_batches = grad_accum;
  o.read_back = false;
  std::unique_ptr<train::CudaGraphStep> g;
  if (graph) g = std::make_unique<train::CudaGraphStep>(model, opt, o);
  Outcome out;
  for (int s = 0; s < steps; ++s) {
    o.lr = 1e-3 * (1.0 + 0.25 * s);  // a schedule: the graph reads each step's rate on the device
    train::StepResult r = graph ? g->step(batch_for(s), o.lr) : train::train_step(model, opt, batch_for(s), o);
    r.read();
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  if (graph) { EXPECT_TRUE(g->captured()); }
  EXPECT_EQ(model.dropout_context().step, uint64_t(steps));  // the host's count advanced by replays too
  g.reset();
  EXPECT_FALSE(model.dropout_context().step_on_device.defined());  // given back with the graph
  out.weights = weights(model);
  out.adam_step = opt.state().step;
  return out;
}

TEST_F(CudaGraphStep, ReplaysEqualEagerStepsBitForBit) {
  for (const bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16 with a loss scaler" : "f32");
    const int steps = 6;  // 2 eager, 1 captured, 3 more replays
    const Outcome eager = run_steps(false, fp16, steps), graph = run_steps(true, fp16, steps);
    EXPECT_EQ(graph.losses, eager.losses);
    EXPECT_EQ(graph.norms, eager.norms);
    EXPECT_EQ(graph.weights, eager.weights);
    EXPECT_EQ(graph.adam_step, steps);
    EXPECT_EQ(eager.adam_step, steps);
    EXPECT_NE(eager.losses.front(), eager.losses.back());  // the steps did change the model
  }
}

// The masks of a replay are those of the eager step it stands for: if a replay reused the captured step's masks,
// the losses from the 4th step on would differ.
TEST_F(CudaGraphStep, DropoutReplaysEqualEagerStepsBitForBit) {
  for (const int64_t accum : {1, 2}) {
    SCOPED_TRACE("grad_accum " + std::to_string(accum));
    const int steps = 6;
    const Outcome eager = run_steps(false, false, steps, 0.2, accum), graph = run_steps(true, false, steps, 0.2, accum);
    EXPECT_EQ(graph.losses, eager.losses);
    EXPECT_EQ(graph.norms, eager.norms);
    EXPECT_EQ(graph.weights, eager.weights);
    if (accum == 1) {
      EXPECT_NE(eager.losses, run_steps(false, false, steps, 0.0).losses);  // dropout did drop
    }
  }
  // fp16 with a loss scaler too.
  const Outcome eager = run_steps(false, true, 5, 0.2), graph = run_steps(true, true, 5, 0.2);
  EXPECT_EQ(graph.losses, eager.losses);
  EXPECT_EQ(graph.weights, eager.weights);
}

TEST_F(CudaGraphStep, AReplayedStepIsOneGraphLaunchAndTheBatch) {
  nn::GPT model(kConfig, 7);
  model.to(kCuda);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  train::StepOptions o;
  train::CudaGraphStep g(model, opt, o);
  for (int s = 0; s < 4; ++s) g.step(batch_for(s), 1e-3);  // 2 eager, 1 captured and replayed, 1 replayed
  const data::Batch batch = batch_for(4);
  const cuda::Counters before = cuda::counters();
  train::StepResult r = g.step(batch, 1e-3);
  const cuda::Counters c = cuda::counters() - before;
  EXPECT_EQ(c.graph_launches, 1);
  EXPECT_EQ(c.kernel_launches, 1);  // the learning rate's fill, outside the graph
  EXPECT_EQ(c.memsets, 0);
  EXPECT_EQ(c.host_syncs, 0);
  EXPECT_EQ(c.d2h_copies, 0);
  EXPECT_EQ(c.device_mallocs, 0);
  EXPECT_EQ(c.h2d_copies, 2);  // ids and targets into the graph's static inputs
  EXPECT_EQ(c.h2d_bytes, 2 * batch.x.numel() * 8);
  r.read();
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_EQ(opt.state().step, 5);
}

TEST_F(CudaGraphStep, RefusesWhatAReplayCannotChange) {
  nn::GPT model(kConfig, 7);
  model.to(kCuda);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  train::CudaGraphStep g(model, opt, {});
  for (int s = 0; s < 3; ++s) g.step(batch_for(s), 1e-3);
  auto message = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  data::Batch ignored = batch_for(3);
  ignored.y.data<int32_t>()[0] = -1;
  EXPECT_NE(message([&] { g.step(ignored, 1e-3); }).find("count of targets"), std::string::npos);
  data::Batch bad = batch_for(3);
  bad.x.data<int32_t>()[0] = 17;
  EXPECT_NE(message([&] { g.step(bad, 1e-3); }).find("must lie in [0, vocab_size = 17)"), std::string::npos);
  EXPECT_NE(message([&] {
              g.step({Tensor::zeros({1, 8}, DType::i32), Tensor::zeros({1, 8}, DType::i32)}, 1e-3);
            }).find("shape"),
            std::string::npos);

  nn::GPT cpu_model(kConfig, 7);
  optim::AdamW opt3(optim::decay_groups(cpu_model.named_parameters(), 0.1), {1e-3});
  EXPECT_NE(message([&] { train::CudaGraphStep(cpu_model, opt3, {}); }).find("CUDA device"), std::string::npos);
}

}  // namespace
}  // namespace minidl
