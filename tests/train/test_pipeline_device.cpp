// A pipeline-parallel step (pp 2, 1F1B, "nccl") on the emulated CUDA device without host round trips (issue #15),
// on a host batch or on one drawn on the device (data::DeviceBatchSampler):
// train::train_step on a pipeline stage with StepOptions::read_back false leaves the loss, shared over the pp group by
// a device all-reduce, in StepResult::on_device like train_step. Oracles: the backend's counters (nothing read back,
// the batch uploaded once), the same steps with read_back true (bit for bit) and one process accumulating over the
// same micro-batches on the same device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dist/topology.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "support/dist_device_test.h"
#include "support/mpi_test.h"
#include "train/grad_sync.h"
#include "train/stage.h"
#include "train/step.h"
#include "train/step.h"

namespace minidl {
namespace {

const nn::GPTConfig& kConfig = testing::kTinyDeviceGpt;
constexpr int kMicroBatches = 2;
constexpr int64_t kRows = 4;

data::Batch tiny_batch(int shift) { return testing::tiny_device_batch(kRows, 8, shift, /*ignore_one=*/false); }

train::StepOptions options(bool fp16, bool read_back, optim::GradScaler& scaler) {
  return testing::tiny_step_options(fp16, read_back, scaler);
}

// How a run's steps are made: read_back false or true, or the host-side reference (what train_step did
// before: the last stage's loss read from forward_backward, summed over the pp group on the host, then
// apply_step).
enum class Mode { kUnread, kRead, kHostReference };

struct Outcome {
  std::vector<double> losses, norms, scales, weights;
  cuda::Counters last_step;  // the counters of the last step, before its numbers are read
};

class PipelineOnDevice : public testing::DistDeviceTest {
 protected:
  void SetUp() override {
    set_up_ranks("pp 2 (x dp 2): runs at 2 and 4 ranks");
    if (IsSkipped()) return;
    const dist::Context& ctx = testing::mpi_context();
    // At 4 ranks: dp 2 x pp 2 with ZeRO 2 over each stage's dp group (reduce-scatter, shard norm, all-gather).
    zero_ = ctx.world_size() == 4 ? 2 : 0;
    topo_ = std::make_unique<dist::Topology>(ctx.world(), dist::Grid{ctx.world_size() / 2, 1, 2}, "nccl", device_);
  }
  // The bitwise comparisons and the bad batch run at pp 2 alone (CI time).
  bool pp_only() const { return zero_ == 0; }

  // This rank's stage of the 2-stage 1F1B pipeline on the device, its gradient sync (ZeRO stage zero_ over dp) and
  // its optimizer.
  struct Stages {
    dist::PipelineSpec spec{dist::ScheduleKind::k1F1B, 2, kMicroBatches};
    train::Stage pipe;
    train::GradSync sync;
    optim::AdamW opt;
    optim::GradScaler scaler;
    static train::Stage& on_device_in_training(train::Stage& p, Device device) {
      p.to(device);
      p.train();
      return p;
    }
    explicit Stages(const PipelineOnDevice& t)
        : pipe(kConfig, 1337, spec, {0, 1, 2}, *t.topo_),
          sync(on_device_in_training(pipe, t.device_), *t.topo_, {.zero = t.zero_, .caps = {}, .buckets = {}}),
          opt(sync.optimizer_groups(optim::decay_groups(pipe.named_parameters(), 0.1)), {1e-2}) {}
  };

  Outcome pipeline(bool fp16, Mode mode, int steps) {
    const bool read_back = mode != Mode::kUnread;
    Stages st(*this);
    train::Stage& pipe = st.pipe;
    train::GradSync& sync = st.sync;
    optim::AdamW& opt = st.opt;
    train::StepOptions o = options(fp16, read_back, st.scaler);
    o.grad_sync = &sync;
    Outcome run;
    for (int s = 0; s < steps; ++s) {
      const data::Batch batch = tiny_batch(s);
      const cuda::Counters before = cuda::counters();
      train::StepResult r;
      if (mode == Mode::kHostReference) {
        r.loss_scale = o.scaler ? o.scaler->current_scale() : 1.0;
        const Tensor loss = train::forward_backward(pipe, batch, o);
        r.loss = train::sum_over(*pipe.pp_group(), loss.defined() ? loss.item() : 0.0);
        r = train::apply_step(opt, sync.owned_params(pipe.parameters()), o, std::move(r));
      } else {
        r = train::train_step(pipe, opt, batch, o);
      }
      run.last_step = cuda::counters() - before;
      EXPECT_EQ(r.pending(), !read_back) << "step " << s;
      if (!read_back) { EXPECT_TRUE(std::isnan(r.loss)) << "step " << s; }
      r.read();
      run.losses.push_back(r.loss);
      run.norms.push_back(r.grad_norm);
      run.scales.push_back(r.loss_scale);
    }
    for (const Tensor& p : pipe.parameters()) {
      const std::vector<double> v = p.detach().to(Device::cpu()).to_vector();
      run.weights.insert(run.weights.end(), v.begin(), v.end());
    }
    return run;
  }

  // One process, the whole model on the same device, accumulating over the same micro-batches.
  std::vector<double> one_process(bool fp16, int steps) {
    return DistDeviceTest::one_process(fp16, steps, kMicroBatches, tiny_batch);
  }

  // `steps` f32 steps, unread, on this dp rank's kRows samples of the global batch of a split: drawn on the device
  // (data::DeviceBatchSampler, as train_gpt does) or by the host's BatchSampler (uploaded by the step).
  Outcome sampled(bool on_device, int steps) {
    Stages st(*this);
    train::Stage& pipe = st.pipe;
    optim::AdamW& opt = st.opt;
    train::StepOptions o = options(false, false, st.scaler);
    o.grad_sync = &st.sync;
    std::vector<int32_t> split(300);
    for (size_t i = 0; i < split.size(); ++i) split[i] = int32_t((i * 7 + i * i % 13) % 17);
    const int64_t global = kRows * topo_->grid().dp, begin = kRows * topo_->coord().dp;
    data::BatchSampler host(split, 8, global, 7);
    data::DeviceBatchSampler device = train::device_sampler(pipe.chunk(0), split, 8, global, 7);
    Outcome run;
    for (int s = 0; s < steps; ++s) {
      train::StepOptions so = o;
      data::Batch batch;
      if (on_device) {
        batch = device.batch(s, begin, kRows);
        so.batch_checked = true;
        so.target_count = kRows * 8;
      } else {
        batch = host.batch(s, begin, kRows);
      }
      const cuda::Counters before = cuda::counters();
      train::StepResult r = train::train_step(pipe, opt, batch, so);
      run.last_step = cuda::counters() - before;
      r.read();
      run.losses.push_back(r.loss);
    }
    for (const Tensor& p : pipe.parameters()) {
      const std::vector<double> v = p.detach().to(Device::cpu()).to_vector();
      run.weights.insert(run.weights.end(), v.begin(), v.end());
    }
    return run;
  }

  int zero_ = 0;
  std::unique_ptr<dist::Topology> topo_;
};

// A steady-state step (the third: the allocator's cache and AdamW's moments are warm) whose numbers are not read
// back: no cudaMalloc, nothing copied to the host, no host synchronisation, and the only host work is the batch's one
// upload per stage (ids to the first, targets to the last), through pinned staging (core/upload.h), as in
// test_device_step. The pipeline's sends and receives and the all-reduces of the loss, the norm and the
// overflow flag are NCCL calls on the device's streams, ordered by events: none of them waits on the host. At 4
// ranks the same holds for dp 2 x pp 2 under ZeRO 2 (reduce-scatter, the shards' norm, the all-gather).
TEST_F(PipelineOnDevice, SteadyStateStepMakesNoRoundTrip) {
  for (const bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16 with a loss scaler" : "f32");
    const Outcome run = pipeline(fp16, Mode::kUnread, 3);
    const cuda::Counters& c = run.last_step;
    EXPECT_EQ(c.device_mallocs, 0);
    EXPECT_EQ(c.d2h_copies, 0);
    EXPECT_EQ(c.d2h_bytes, 0);
    EXPECT_EQ(c.h2d_copies, 1);             // ids (first stage) or targets (last stage) of the whole batch
    EXPECT_EQ(c.h2d_bytes, kRows * 8 * 8);  // as i64
    EXPECT_EQ(c.host_syncs, 0);             // the upload goes through pinned staging (core/upload.h)
    EXPECT_GT(c.kernel_launches, 0);
    for (double loss : run.losses) EXPECT_TRUE(std::isfinite(loss));
    if (fp16) { EXPECT_EQ(run.scales.back(), 65536.0); }
  }
}

// The batch drawn on the device (data::DeviceBatchSampler, train_gpt --pp on a device): a steady-state step copies
// nothing to the device either (0 uploads where the host batch takes 1 per stage), and the steps equal those on
// the host sampler's batches bit for bit (losses, weights); at 4 ranks each dp rank's slice of the global batch.
TEST_F(PipelineOnDevice, DeviceSampledBatchCopiesNothingAndEqualsTheHostBatch) {
  const Outcome host = sampled(false, 3), device = sampled(true, 3);
  EXPECT_EQ(device.losses, host.losses);
  EXPECT_EQ(device.weights, host.weights);
  EXPECT_EQ(host.last_step.h2d_copies, 1);
  testing::expect_no_round_trip(device.last_step, 0);
}

// Three steps with read_back false equal the same steps read back at once and the host-side reference, bit for bit
// (losses on both stages, norms, scales, weights), and the losses of one process with grad_accum 2 within 1e-5
// (only the tied wte's gradient is added in another order).
TEST_F(PipelineOnDevice, UnreadStepsEqualReadStepsAndOneProcess) {
  if (!pp_only()) GTEST_SKIP() << "runs at pp 2 alone";
  constexpr int kSteps = 3;
  for (const bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16 with a loss scaler" : "f32");
    const Outcome unread = pipeline(fp16, Mode::kUnread, kSteps);
    for (const Mode mode : {Mode::kRead, Mode::kHostReference}) {
      SCOPED_TRACE(mode == Mode::kRead ? "read_back true" : "host-side reference");
      const Outcome read = pipeline(fp16, mode, kSteps);
      EXPECT_EQ(unread.losses, read.losses);
      EXPECT_EQ(unread.norms, read.norms);
      EXPECT_EQ(unread.scales, read.scales);
      EXPECT_EQ(unread.weights, read.weights);
    }
    const std::vector<double> ref = one_process(fp16, kSteps);
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(unread.losses[size_t(s)], ref[size_t(s)], 1e-5 * std::abs(ref[size_t(s)])) << "step " << s;
      EXPECT_GT(unread.norms[size_t(s)], 0.05) << "step " << s;  // the clip was active
    }
  }
}

// A bad host batch is refused on the host with GPT's messages before anything is uploaded or sent (so both ranks
// throw here, none waits on the other): the first stage names a token id, the last a target.
TEST_F(PipelineOnDevice, BadHostBatchIsRefusedBeforeUpload) {
  if (!pp_only()) GTEST_SKIP() << "runs at pp 2 alone";
  dist::PipelineSpec spec{dist::ScheduleKind::k1F1B, 2, kMicroBatches};
  train::Stage pipe(kConfig, 1337, spec, {0, 1, 2}, *topo_);
  pipe.to(device_);
  train::GradSync sync(pipe, *topo_);
  optim::AdamW opt(optim::decay_groups(pipe.named_parameters(), 0.1), {1e-2});
  optim::GradScaler scaler;
  train::StepOptions o = options(false, false, scaler);
  o.grad_sync = &sync;
  std::vector<int32_t> ids(size_t(kRows * 8), 1), targets(size_t(kRows * 8), 2);
  ids[5] = 17;
  targets[3] = -2;
  const data::Batch bad{Tensor::from_vector(ids, {kRows, 8}), Tensor::from_vector(targets, {kRows, 8})};
  const cuda::Counters before = cuda::counters();
  try {
    train::train_step(pipe, opt, bad, o);
    ADD_FAILURE() << "a bad batch was accepted";
  } catch (const Error& e) {
    const std::string expected = pipe.first_stage()
                                     ? "token ids must lie in [0, vocab_size = 17), got 17 at flat index 5"
                                     : "targets must lie in [0, vocab_size = 17), got -2 at flat index 3";
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
  EXPECT_EQ((cuda::counters() - before).h2d_copies, 0);
}

}  // namespace
}  // namespace minidl
