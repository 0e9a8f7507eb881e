#include "train/step.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "optim/clip.h"

namespace minidl::train {

int64_t count_targets(const Tensor& y) {
  int64_t n = 0;
  for (double v : y.to_vector()) n += v != -1.0;
  return n;
}

StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch,
                      const StepOptions& o) {
  const int64_t rows = batch.x.size(0), k = o.grad_accum;
  MINIDL_CHECK(k >= 1 && rows % k == 0, "train_step: a batch of ", rows, " sequences does not split into grad_accum = ",
               k, " equal micro-batches");
  MINIDL_CHECK(o.amp == DType::f32 || ops::is_half(o.amp), "train_step: amp must be f32 (off), bf16 or f16, got ",
               o.amp);
  const int64_t micro = rows / k;
  // The normaliser of the whole step. Under DDP each rank divides by its own slice's count and DDP averages over
  // ranks: with equal-sized slices and no ignored targets that is the global mean exactly.
  const int64_t targets = o.target_count >= 0 ? o.target_count : count_targets(batch.y);
  const double inv_targets = 1.0 / double(std::max<int64_t>(1, targets));
  StepResult r;
  const Device device = model.parameters().front().device();
  if (o.scaler && device.is_cuda()) {
    o.scaler->keep_state_on(device);  // the scale stays there (apply_step)
    r.loss_scale = NAN;
    r.on_device.loss_scale = o.scaler->scale(Tensor::ones({}, DType::f32, device)).detach();
  } else {
    r.loss_scale = o.scaler ? o.scaler->current_scale() : 1.0;
  }
  {
    MemoryTagGuard tag(MemTag::kActivations);
    std::optional<ops::HostCheckedIndicesGuard> checked;  // a sampled device batch: checked with its split
    if (o.batch_checked) checked.emplace();
    // One guard over every micro-batch: the 16-bit weight copies are made once per step (autograd/autocast.h).
    std::optional<autograd::AutocastGuard> autocast;
    if (o.amp != DType::f32) autocast.emplace(o.amp);
    // Micro-batch m holds samples [first + m * micro, ...) of the global batch: its dropout masks are those one big
    // batch would draw for the same samples (nn::DropoutContext).
    nn::DropoutContext& dropout = model.dropout_context();
    const int64_t first = dropout.first_sample;
    Tensor loss_sum;
    for (int64_t m = 0; m < k; ++m) {
      // The batch goes to the model as it is: GPT::loss checks a host batch's ids and targets on the host and uploads
      // them once (on a device no host copy is read back to check them); a sampled device batch is used in place.
      Tensor x = batch.x.narrow(0, m * micro, micro), y = batch.y.narrow(0, m * micro, micro);
      dropout.first_sample = first + m * micro;
      Tensor loss = mul(model.loss(x, y, Reduction::kSum), inv_targets);
      // Summed where the loss lives and read once after the last micro-batch (on a GPU: one sync per step).
      loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
      if (o.scaler) loss = o.scaler->scale(loss);
      // DDP: no_sync() for all but the last micro-batch, whose backward launches the bucketed all-reduce.
      if (o.grad_sync) o.grad_sync->before_backward(/*sync=*/m + 1 == k);
      loss.backward();
    }
    if (o.grad_sync) o.grad_sync->after_backward();
    dropout.first_sample = first;
    dropout.step += 1;
    if (device.is_cuda()) {
      r.loss = NAN;
      r.on_device.loss = loss_sum;
    } else {
      r.loss = loss_sum.item();
    }
  }
  // The gradients this rank owns: every parameter's, or (ZeRO) its shard's.
  std::vector<Tensor> params = o.grad_sync ? o.grad_sync->owned_params(model.parameters()) : model.parameters();
  return apply_step(optimizer, params, o, std::move(r));
}

void StepResult::read() {
  if (!pending()) return;
  if (on_device.loss.defined()) loss = on_device.loss.item();
  const bool overflow = on_device.found_inf.defined() && on_device.found_inf.item() != 0;
  grad_norm = overflow ? INFINITY : std::sqrt(on_device.grad_norm_squared.item());
  applied = !overflow;
  skip_reason = overflow ? "inf/nan in gradients" : "";
  if (on_device.loss_scale.defined()) loss_scale = on_device.loss_scale.item();
  on_device = {};
}

namespace {

// apply_step on a CUDA device: the same steps with every decision taken on the device (optim/clip.h,
// optim/grad_scaler.h, Optimizer::step_unless), so nothing is read back.
StepResult apply_step_on_device(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& o,
                                StepResult r, Device device) {
  if (o.scaler) {
    o.scaler->keep_state_on(device);
    if (o.grad_sync)
      o.scaler->combine_overflow_on_device = [sync = o.grad_sync](const Tensor& f) {
        sync->combine_overflow_on_device(f);
      };
    r.on_device.found_inf = o.scaler->unscale_(params);
  }
  // With an overflow the norm is inf or NaN and the clip multiplies by 0 or nothing: the step is skipped anyway.
  r.on_device.grad_norm_squared = o.grad_sync ? o.grad_sync->grad_norm_squared_on_device(params, device)
                                              : optim::grad_norm_squared_tensor(params, device);
  if (o.grad_clip > 0) optim::clip_grads_by(params, r.on_device.grad_norm_squared, o.grad_clip);
  optimizer.set_lr(o.lr);
  if (o.scaler) o.scaler->step(optimizer);
  else optimizer.step();
  if (o.grad_sync) o.grad_sync->after_step();
  optimizer.zero_grad();
  if (o.read_back) r.read();
  return r;
}

}  // namespace

StepResult apply_step(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& o,
                      StepResult r) {
  if (!params.empty() && params.front().device().is_cuda())
    return apply_step_on_device(optimizer, params, o, std::move(r), params.front().device());
  if (o.scaler && o.grad_sync)  // every rank skips the step when any rank that holds gradients overflowed
    o.scaler->combine_overflow = [sync = o.grad_sync](bool local) { return sync->combine_overflow(local); };
  bool overflow = o.scaler && o.scaler->unscale_and_check(params);
  r.grad_norm = overflow ? INFINITY
                         : std::sqrt(o.grad_sync ? o.grad_sync->grad_norm_squared(params)
                                                 : optim::grad_norm_squared(params));
  if (o.grad_clip > 0 && !overflow) {
    double factor = optim::clip_factor(r.grad_norm, o.grad_clip);
    if (factor < 1.0) optim::scale_grads(params, factor);
  }
  optimizer.set_lr(o.lr);
  if (o.scaler) {
    optim::ScalerStep s = o.scaler->step(optimizer);
    r.applied = s.applied;
    r.skip_reason = s.reason;
    optimizer.zero_grad();
  } else {
    optimizer.step_and_zero_grad();  // after_step gathers parameters only: the gradients may go first
  }
  if (o.grad_sync) o.grad_sync->after_step();
  return r;
}

data::DeviceBatchSampler device_sampler(const nn::GPT& model, const std::vector<int32_t>& split, int64_t seq,
                                        int64_t global_batch, uint64_t seed) {
  model.check_ids(Tensor::from_vector(split, {int64_t(split.size())}, DType::i32), "token ids of the training split",
                  false);
  return data::DeviceBatchSampler(split, seq, global_batch, seed, model.parameters().front().device());
}

data::Batch draw_checked(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n,
                         StepOptions& options) {
  options.target_count = n * sampler.seq();  // a checked split has no ignored (-1) target
  options.batch_checked = true;
  return sampler.batch(step, begin, n);
}

StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, data::DeviceBatchSampler& sampler, int64_t step,
                      int64_t begin, int64_t n, StepOptions options) {
  const data::Batch batch = draw_checked(sampler, step, begin, n, options);
  return train_step(model, optimizer, batch, options);
}

StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch, double lr,
                      double grad_clip) {
  StepOptions o;
  o.lr = lr;
  o.grad_clip = grad_clip;
  return train_step(model, optimizer, batch, o);
}

}  // namespace minidl::train
