// A tensor-parallel step on the emulated CUDA device without host round trips (issue #15): the vocabulary-parallel
// embedding and cross-entropy find their rank's ids and targets on the device (ops/vocab_range.h) instead of
// reading them back. tp 2 at 2 ranks (with and without sequence parallelism), tp 2 x pp 2 and dp 2 x tp 2 (DDP,
// ZeRO 2) at 4 ranks, over "nccl",
// built as the trainer builds them (train::build_model_and_sync). Oracles: the backend's counters (nothing read
// back, no host synchronisation, only the batch uploaded) and one process on the same device accumulating over
// the same micro-batches.
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
#include "train/parallel_model.h"
#include "train/step.h"

namespace minidl {
namespace {

const nn::GPTConfig& kConfig = testing::kTinyDeviceGpt;
constexpr int64_t kRows = 4, kSeq = 8;

data::Batch tiny_batch(int shift) { return testing::tiny_device_batch(kRows, kSeq, shift, /*ignore_one=*/true); }

struct Outcome {
  std::vector<double> losses, norms;
  cuda::Counters last_step;  // the counters of the last step, before its numbers are read
};

class TensorParallelOnDevice : public testing::DistDeviceTest {
 protected:
  void SetUp() override {
    set_up_ranks("tp 2 (x pp 2): runs at 2 and 4 ranks");
    if (IsSkipped()) return;
    const dist::Context& ctx = testing::mpi_context();
    pp_ = ctx.world_size() / 2;
    topo_ = std::make_unique<dist::Topology>(ctx.world(), dist::Grid{1, 2, pp_}, "nccl", device_);
  }

  // The tp 2 (x pp 2) grid of SetUp, or another topology (dp 2 x tp 2, each dp rank taking its half of the batch).
  // batches: the fixed tiny batches, or the batches of a split drawn by the host's BatchSampler or on the device
  // (data::DeviceBatchSampler, as train_gpt does).
  enum class Batches { kTiny, kHostSampler, kDeviceSampler };
  Outcome parallel(bool fp16, bool sequence_parallel, int steps, const dist::Topology* other = nullptr, int zero = 0,
                   Batches batches = Batches::kTiny) {
    const dist::Topology& topo = other ? *other : *topo_;
    const int dp = topo.dp_group().size();
    const int64_t local = kRows / dp, first = topo.coord().dp * local;
    train::TrainConfig cfg;
    cfg.layers = kConfig.n_layer;
    cfg.heads = kConfig.n_head;
    cfg.embd = kConfig.n_embd;
    cfg.seq = kSeq;
    cfg.batch = kRows;
    cfg.tp = 2;
    cfg.pp = topo.pp_group().size();
    cfg.dp = dp;
    cfg.zero = zero;
    cfg.sequence_parallel = sequence_parallel;
    cfg.weight_decay = 0.1;
    train::ParallelModel m = train::build_model_and_sync(cfg, kConfig, topo, device_, first, {});
    optim::AdamW opt(m.sync->optimizer_groups(optim::decay_groups(m.stage->named_parameters(), 0.1)), {1e-2});
    optim::GradScaler scaler;
    train::StepOptions o = testing::tiny_step_options(fp16, /*read_back=*/false, scaler);
    o.grad_sync = m.sync.get();
    std::vector<int32_t> split(300);
    for (size_t i = 0; i < split.size(); ++i) split[i] = int32_t((i * 7 + i * i % 13) % 17);
    data::BatchSampler host(split, kSeq, kRows, 7);
    data::DeviceBatchSampler device = train::device_sampler(m.stage->chunk(0), split, kSeq, kRows, 7);
    Outcome run;
    for (int s = 0; s < steps; ++s) {
      const data::Batch whole = tiny_batch(s);
      data::Batch batch{whole.x.narrow(0, first, local).contiguous(), whole.y.narrow(0, first, local).contiguous()};
      o.batch_checked = batches == Batches::kDeviceSampler;
      o.target_count = o.batch_checked ? local * kSeq : -1;
      if (batches == Batches::kHostSampler) batch = host.batch(s, first, local);
      if (batches == Batches::kDeviceSampler) batch = device.batch(s, first, local);
      const cuda::Counters before = cuda::counters();
      train::StepResult r = train::train_step(*m.stage, opt, batch, o);
      run.last_step = cuda::counters() - before;
      EXPECT_TRUE(r.pending()) << "step " << s;
      r.read();
      run.losses.push_back(r.loss);
      run.norms.push_back(r.grad_norm);
    }
    return run;
  }

  // One process, the whole model on the same device, over the same micro-batches (the pipeline's: pp of them).
  std::vector<double> one_process(bool fp16, int steps) {
    return DistDeviceTest::one_process(fp16, steps, pp_ > 1 ? pp_ : 1, tiny_batch);
  }

  int pp_ = 1;
  std::unique_ptr<dist::Topology> topo_;
};

// A steady-state step (the third: the allocator's cache and AdamW's moments are warm) whose numbers are not read
// back: no cudaMalloc, nothing copied to the host, no host synchronisation; the only transfer is the batch, as i64
// through pinned staging (core/upload.h): ids and targets at tp alone, the first stage's ids or the last stage's
// targets at tp x pp. Before, every step copied the ids and targets back (the embedding and the cross-entropy
// rewrote them on the host) and uploaded what it made of them.
TEST_F(TensorParallelOnDevice, SteadyStateStepMakesNoRoundTrip) {
  for (const bool fp16 : {false, true}) {
    for (const bool sp : {false, true}) {
      if (sp && pp_ > 1) continue;  // CI time: sequence parallelism at tp alone
      SCOPED_TRACE(std::string(fp16 ? "fp16 with a loss scaler" : "f32") + (sp ? ", sequence parallel" : ""));
      const Outcome run = parallel(fp16, sp, 3);
      const cuda::Counters& c = run.last_step;
      EXPECT_EQ(c.device_mallocs, 0);
      EXPECT_EQ(c.d2h_copies, 0);
      EXPECT_EQ(c.d2h_bytes, 0);
      EXPECT_EQ(c.host_syncs, 0);
      EXPECT_EQ(c.h2d_copies, pp_ > 1 ? 1 : 2);
      EXPECT_EQ(c.h2d_bytes, (pp_ > 1 ? 1 : 2) * kRows * kSeq * 8);
      EXPECT_GT(c.kernel_launches, 0);
      for (double loss : run.losses) EXPECT_TRUE(std::isfinite(loss));
    }
  }
}

// dp 2 x tp 2 at 4 ranks, under DDP and under ZeRO 2 (the GradSync over them combines the device
// norm): the same counts, the batch being each dp rank's half.
TEST_F(TensorParallelOnDevice, DataTimesTensorParallelStepMakesNoRoundTrip) {
  if (pp_ == 1) GTEST_SKIP() << "dp 2 x tp 2: runs at 4 ranks";
  const dist::Topology dp_tp(testing::mpi_context().world(), dist::Grid{2, 2, 1}, "nccl", device_);
  for (const int zero : {0, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Outcome run = parallel(false, false, 3, &dp_tp, zero);
    const cuda::Counters& c = run.last_step;
    EXPECT_EQ(c.device_mallocs, 0);
    EXPECT_EQ(c.d2h_copies, 0);
    EXPECT_EQ(c.host_syncs, 0);
    EXPECT_EQ(c.h2d_copies, 2);
    EXPECT_EQ(c.h2d_bytes, 2 * (kRows / 2) * kSeq * 8);
    for (double loss : run.losses) EXPECT_TRUE(std::isfinite(loss));
  }
}

// The batch drawn on the device (data::DeviceBatchSampler, train_gpt --tp on a device): a steady-state step copies
// nothing to the device either, and its losses and norms equal those on the host sampler's batches bit for bit; at
// 4 ranks through tp 2 x pp 2.
TEST_F(TensorParallelOnDevice, DeviceSampledBatchCopiesNothingAndEqualsTheHostBatch) {
  const Outcome host = parallel(false, false, 3, nullptr, 0, Batches::kHostSampler),
                device = parallel(false, false, 3, nullptr, 0, Batches::kDeviceSampler);
  EXPECT_EQ(device.losses, host.losses);
  EXPECT_EQ(device.norms, host.norms);
  EXPECT_GT(host.last_step.h2d_copies, 0);
  testing::expect_no_round_trip(device.last_step, 0);
}

// Three steps' losses equal one process's on the same device within 1e-5 in f32 (the split GEMMs and all-reduces
// add in another order) and 2e-4 in fp16 (there the row-parallel layers' partial products are rounded to 16 bits
// before their all-reduce), with the clip active.
TEST_F(TensorParallelOnDevice, StepsEqualOneProcess) {
  constexpr int kSteps = 3;
  for (const bool fp16 : {false, true}) {
    const std::vector<double> ref = one_process(fp16, kSteps);
    for (const bool sp : {false, true}) {
      if (sp && pp_ > 1) continue;
      SCOPED_TRACE(std::string(fp16 ? "fp16 with a loss scaler" : "f32") + (sp ? ", sequence parallel" : ""));
      const Outcome run = parallel(fp16, sp, kSteps);
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(run.losses[size_t(s)], ref[size_t(s)], (fp16 ? 2e-4 : 1e-5) * std::abs(ref[size_t(s)]))
            << "step " << s;
        EXPECT_GT(run.norms[size_t(s)], 0.05) << "step " << s;  // the clip was active
      }
    }
  }
}

}  // namespace
}  // namespace minidl
