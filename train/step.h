// One optimizer step, for every layout: the executor runs this rank's action list of the stage's schedule (forwards,
// backwards, the sends and receives between stages), then the second half (apply_step): unscale, clip, the
// optimizer. With pp = 1 the schedule is 1F1B over one stage, forward and backward of micro-batch 0, 1, ..., M − 1:
// gradient accumulation. train::Trainer (train/trainer.h) calls it once a step; bench_gpt_step and the tests call
// it directly.
//
//   train::StepOptions o;
//   o.lr = 1e-3;
//   o.micro_batches = 2;                                                     // for a plain GPT
//   train::StepResult r = train::train_step(model, optimizer, batch, o);     // r.loss, r.grad_norm, r.applied
//   train::StepResult s = train::train_step(stage, optimizer, batch, o);     // M = the stage's schedule's
//
// Equivalence: every chunk runs the backward of micro-batch 0, 1, ..., M − 1 in that order, with the same
// normaliser (1 / target tokens of the whole batch) and the same dropout positions as one process accumulating
// over the same micro-batches, so every gradient is bitwise the same, except with pp > 1 the tied wte's, whose
// embedding and head halves are added in another order (the all-reduce over the embedding group adds the two sums).
#pragma once

#include <cstdint>
#include <string>

#include "data/sampler.h"
#include "nn/gpt.h"
#include "nn/moe.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "train/grad_sync.h"
#include "train/stage.h"

namespace minidl::train {

struct StepOptions {
  double lr = 1e-3;
  double grad_clip = 1.0;     // global L2 norm; <= 0 disables clipping
  int64_t micro_batches = 1;  // train_step(nn::GPT&, ...): micro-batches per step (a Stage has its schedule's)
  DType amp = DType::f32;     // bf16 / f16: forward and backward under AutocastGuard(amp) (autograd/autocast.h)
  optim::GradScaler* scaler = nullptr;  // dynamic loss scaling (f16); null: none
  // How gradients are synchronised across ranks (train/grad_sync.h); by default one process: nothing to synchronise.
  GradSync* grad_sync = &GradSync::one_process();
  // On a CUDA device the step's second half never reads anything back: the gradient norm, the clip, the overflow
  // flag, the loss scale and the optimizer's skip stay on the device (apply_step). read_back: fill the StepResult's
  // numbers at the end of the step (one synchronisation); false leaves them in StepResult::on_device until
  // StepResult::read(), for steps whose numbers nobody looks at (train::Trainer reads on the steps it logs).
  // Ignored on the CPU, where everything is read as it is computed.
  bool read_back = true;
  // >= 0: the number of the batch's targets that count (not -1), given by a caller whose batch is already on the
  // device (train::CudaGraphStep), so the step does not read it back to count them; -1: counted from batch.y.
  int64_t target_count = -1;
  // The batch is on the model's device and every id in it was checked against the vocabulary before it got there
  // (a data::DeviceBatchSampler over a split that train::device_sampler checked): the step's ops do not read it
  // back to check it (ops::HostCheckedIndicesGuard).
  bool batch_checked = false;
};

struct StepResult {
  double loss = 0;       // mean cross-entropy over every target token of this rank's batch (on every pp rank)
  double grad_norm = 0;  // global L2 norm before clipping (unscaled; inf when the step overflowed)
  bool applied = true;   // false: the scaler skipped the update (inf/NaN gradients)
  std::string skip_reason;
  double loss_scale = 1;               // the scale this step used (1 without a scaler)
  std::vector<nn::MoE::Load> experts;  // a mixture of experts' layers on this rank (balance_experts)

  // With StepOptions::read_back false on a device: the fields above are not filled in yet (NaN; applied true) and
  // their values wait here: the loss (f32), the gradients' sum of squares combined over the ranks (f32), the
  // overflow flag (i32; undefined without a scaler) and the scale the step used (f32; undefined without a scaler).
  struct OnDevice {
    Tensor loss, grad_norm_squared, found_inf, loss_scale;
  } on_device;
  bool pending() const { return on_device.grad_norm_squared.defined(); }
  // Reads on_device into the fields above (a few synchronisations) and clears it; nothing when not pending.
  void read();
};

// The targets of a host batch that count towards the loss (all but the ignore index -1): the step's divisor.
int64_t count_targets(const Tensor& y);

// The forward and backward half of a step: runs this rank's action list over `batch` (this dp rank's slice, every
// pp rank passing the same one; split into the schedule's M micro-batches) and then options.grad_sync's
// after_backward, leaving the gradients (scaled by the scaler, if any) in .grad(); advances the dropout step.
// Returns the batch's loss summed where it was computed (the last stage; undefined elsewhere), not read back.
// A non-finite loss under a scaler is an overflow like any other: its gradients are non-finite and the scaler skips.
// On a CUDA device a host batch is checked on the host and uploaded once (ids to the first stage, targets to the
// last). Collective over the pp group.
Tensor forward_backward(Stage& stage, const data::Batch& batch, const StepOptions& options);
// A mixture of experts' step (nn/moe.h), once per optimizer step: each MoE layer of the stage's chunks takes the
// slots its experts were sent and ran in the step's backward passes, summed over the topology's dp group (dp x cp);
// under bias balancing they move its expert bias. Returns each layer's load (StepResult::experts). train_step
// calls it after forward_backward.
std::vector<nn::MoE::Load> balance_experts(Stage& stage);

// One optimizer step over `batch`: forward_backward, the loss shared over the pp group (computed on the last stage;
// on a device by an all-reduce of a device scalar, waiting in r.on_device.loss with read_back false), then
// apply_step on the gradients this rank owns (GradSync::owned_params: ZeRO's shard).
StepResult train_step(Stage& stage, optim::Optimizer& optimizer, const data::Batch& batch, const StepOptions& options);
// The same for a whole model this process holds (Stage::of(model, options.micro_batches)).
StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch,
                      const StepOptions& options);

// The second half of a step, after the backward passes: on `params`, the gradients this rank owns, unscale and check
// for overflow (combined over the ranks by the GradSync), the gradient norm into r.grad_norm, clipping, the
// optimizer's step at options.lr (or the scaler's skip into r.applied / r.skip_reason), GradSync::after_step,
// zero_grad.
StepResult apply_step(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& options,
                      StepResult r);

// A sampler that draws the training batches on `model`'s device (a CUDA device) from `split`, uploaded once: every
// token is checked here, once, against the model's vocabulary (GPT::check_ids' message, naming the split), so no
// step needs to check its batch again.
data::DeviceBatchSampler device_sampler(const nn::GPT& model, const std::vector<int32_t>& split, int64_t seq,
                                        int64_t global_batch, uint64_t seed);

// Samples [begin, begin + n) of the global batch of `step`, drawn by `sampler` on the device, with `options` told
// so (target_count, batch_checked): what train_step needs to read nothing back for it.
data::Batch draw_checked(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n,
                         StepOptions& options);

// train_step on samples [begin, begin + n) of the global batch of `step` drawn by `sampler` on the device.
StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, data::DeviceBatchSampler& sampler, int64_t step,
                      int64_t begin, int64_t n, StepOptions options);

}  // namespace minidl::train
