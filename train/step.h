// One optimizer step of a GPT: the micro-batch loop, mixed precision, loss scaling, the gradient-synchronisation
// strategy, clipping and the optimizer. train::Trainer (train/trainer.h) calls it once a step; bench_gpt_step and
// the tests call it directly.
//
//   train::StepOptions o;
//   o.lr = 1e-3;
//   o.grad_accum = 2;
//   train::StepResult r = train::train_step(model, optimizer, batch, o);   // r.loss, r.grad_norm, r.applied
#pragma once

#include <cstdint>
#include <string>

#include "data/sampler.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "train/grad_sync.h"

namespace minidl::train {

struct StepOptions {
  double lr = 1e-3;
  double grad_clip = 1.0;     // global L2 norm; <= 0 disables clipping
  int64_t grad_accum = 1;     // micro-batches per optimizer step; must divide the batch's rows
  DType amp = DType::f32;     // bf16 / f16: forward and backward under AutocastGuard(amp) (autograd/autocast.h)
  optim::GradScaler* scaler = nullptr;  // dynamic loss scaling (f16); null: none
  // How gradients are synchronised across ranks (train/grad_sync.h); null: one process, nothing to synchronise.
  // It also combines the gradient norm and the fp16 overflow flag over the ranks that hold gradients.
  GradSync* grad_sync = nullptr;
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
  double loss = 0;         // mean cross-entropy over every target token of this rank's batch
  double grad_norm = 0;    // global L2 norm before clipping (unscaled; inf when the step overflowed)
  bool applied = true;     // false: the scaler skipped the update (inf/NaN gradients)
  std::string skip_reason;
  double loss_scale = 1;   // the scale this step used (1 without a scaler)

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

// The targets of a host batch that count towards the loss (all but the ignore index -1): the divisor of the
// step's mean loss, for train_step and the pipeline step alike.
int64_t count_targets(const Tensor& y);

// One optimizer step over `batch`, split into options.grad_accum micro-batches of equal size:
//   for each micro-batch: loss_m = sum of its token losses / (target tokens in the whole batch), backward
//   (the gradients add up to those of the mean over the whole batch, exactly as one big batch would give);
//   then unscale (with a scaler), clip, the optimizer's step at options.lr (or a skip), zero_grad; unscaling,
//   clipping and the step work on the gradients this rank owns (GradSync::owned_params: ZeRO's shard).
// A non-finite loss under a scaler is an overflow like any other: its gradients are non-finite, the scaler skips
// the step and backs off (applied = false), as PyTorch's GradScaler does.
// The dropout context advances by one step per call; micro-batch m sees first_sample + m * micro, so its masks are
// those of the same samples in one big batch (nn::DropoutContext).
StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch,
                      const StepOptions& options);

// The second half of a step, after the backward passes (train_step's, or a pipeline schedule's): on `params`, the
// gradients this rank owns (GradSync::owned_params), unscale and check for overflow (combined over the ranks by
// the GradSync), the gradient norm into r.grad_norm, clipping, the optimizer's step at options.lr (or the
// scaler's skip into r.applied / r.skip_reason), GradSync::after_step, zero_grad.
StepResult apply_step(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& options,
                      StepResult r);

// A sampler that draws the training batches on `model`'s device (a CUDA device) from `split`, uploaded once: every
// token is checked here, once, against the model's vocabulary (GPT::check_ids' message, naming the split), so no
// step needs to check its batch again.
data::DeviceBatchSampler device_sampler(const nn::GPT& model, const std::vector<int32_t>& split, int64_t seq,
                                        int64_t global_batch, uint64_t seed);

// Samples [begin, begin + n) of the global batch of `step`, drawn by `sampler` on the device, with `options` told
// so (target_count, batch_checked): what train_step and pipeline_train_step need to read nothing back for it.
data::Batch draw_checked(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n,
                         StepOptions& options);

// train_step on samples [begin, begin + n) of the global batch of `step` drawn by `sampler` on the device
// (data::DeviceBatchSampler, from train::device_sampler): the batch BatchSampler::batch(step, begin, n) gives, with
// no copy to the device and nothing read back for it (options.target_count and batch_checked are set here).
StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, data::DeviceBatchSampler& sampler, int64_t step,
                      int64_t begin, int64_t n, StepOptions options);

// The same with defaults: full precision, one micro-batch.
StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch, double lr,
                      double grad_clip);

}  // namespace minidl::train
