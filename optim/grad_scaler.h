// GradScaler: dynamic loss scaling for f16 mixed precision. f16 gradients underflow to zero below 2^-24; the
// loss is multiplied by a large scale before backward so they stay representable, and the f32 gradients are
// divided by it again before the optimizer step. The scale adapts: it backs off when gradients overflow (that
// step is skipped) and grows again after a run of clean steps. bf16 has f32's exponent range and needs none.
//
//   optim::GradScaler scaler;                          // 2^16, x2 every 2000 clean steps, x0.5 on overflow
//   scaler.scale(loss).backward();
//   if (!scaler.unscale_and_check(params)) clip...;    // optional: unscale first to clip true gradients
//   optim::ScalerStep s = scaler.step(optimizer);      // applied, or skipped with the reason
//   optimizer.zero_grad();
//
// Rules (checked against a reference model in tests/optim/test_grad_scaler.cpp), applied by step():
// - clean step (no inf/NaN): the optimizer steps; clean_steps += 1; when clean_steps reaches growth_interval the
//   scale becomes min(scale * growth_factor, max_scale), clean_steps restarts at 0 and overflows_left is refilled
//   to hysteresis.
// - overflow: the optimizer does not step (weights, moments and its step count are untouched, bit for bit);
//   clean_steps = 0; overflows_left -= 1 (not below 0); if it is then 0 the scale becomes
//   max(scale * backoff_factor, min_scale). Hysteresis h tolerates h - 1 overflows before the first backoff;
//   once spent, every overflow backs off until the scale next grows (Megatron-LM's and DeepSpeed's rule).
// A skipped step is reported in ScalerStep; the caller decides whether its LR schedule advances (train_gpt holds it
// unless --advance-lr-on-skip).
//
// Distributed: every rank that holds part of the gradients (data-parallel replicas after their all-reduce see
// the same values; ZeRO shards and tensor/pipeline-parallel pieces do not) must take the same decision.
// unscale_and_check passes its local flag through `combine_overflow`, identity by default; a distributed
// wrapper sets it to an OR all-reduce over the group that shares the step (e.g. MAX of 0/1 over the DP x TP x PP
// ranks), so all of them skip or apply together.
//
// On a CUDA device (keep_state_on(device), what train::train_step does for a model on a device) the state lives
// there and nothing is read back in a step, as PyTorch's GradScaler with fused optimizers: unscale_ writes a
// found-inf flag on the device (combined over ranks by combine_overflow_on_device), the optimizer skips on it
// (Optimizer::step_unless: AdamW's kernel reads it), and one kernel applies the rules above to the device state.
// The host learns the scale and the skipped steps when it asks (current_scale(), skipped_steps(), state(): one
// synchronisation each), e.g. when it logs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace minidl::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // consecutive clean steps before growing
  int64_t hysteresis = 1;          // overflowing steps tolerated before backing off; 1 = back off on the first
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

// Everything that evolves: what a checkpoint saves.
struct GradScalerState {
  double scale = 65536.0;
  int64_t clean_steps = 0;     // consecutive clean steps since the last growth or overflow
  int64_t overflows_left = 1;  // hysteresis budget
  int64_t skipped_steps = 0;   // total overflowing (skipped) steps
  bool operator==(const GradScalerState&) const = default;
};

struct ScalerStep {
  bool applied = true;
  std::string reason;     // why it was skipped ("inf/nan in gradients"); empty when applied
  double scale = 0;       // the scale this step's gradients were computed with
  double next_scale = 0;  // the scale for the next step
  // With the state on a device: the step's overflow flag there (i32 {1}); the fields above are then not known
  // (applied true, scales NaN) until the caller reads it.
  Tensor found_inf;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale (differentiable); with the state on a device, by the device's scale.
  Tensor scale(const Tensor& loss) const;
  // Moves the state to `device` (a CUDA device) for good: no step reads anything back from then on.
  void keep_state_on(Device device);
  bool state_on_device() const { return device_state_.defined(); }
  // With the state on a device: unscales like unscale_and_check and returns the device's overflow flag (i32 {1}),
  // without reading it. At most once per step; step() calls it if not done.
  Tensor unscale_(const std::vector<Tensor>& params);
  // One fused pass per gradient (ops/unscale.h): divides every gradient of `params` by the scale and detects inf/
  // NaN. Returns the overflow flag after combine_overflow. At most once per step; step() calls it if not done.
  bool unscale_and_check(const std::vector<Tensor>& params);
  // Steps the optimizer unless the gradients overflowed, then updates the scale (rules above).
  ScalerStep step(Optimizer& optimizer);

  // With the state on a device each of these reads it (one synchronisation).
  double current_scale() const { return state().scale; }
  int64_t skipped_steps() const { return state().skipped_steps; }
  const GradScalerOptions& options() const { return options_; }
  GradScalerState state() const;
  // Checks the values (scale within [min_scale, max_scale], counters >= 0) and replaces the state.
  void load_state(const GradScalerState& state);

  // Combines this rank's overflow flag with the other ranks' (see above). Identity by default.
  std::function<bool(bool local_overflow)> combine_overflow = [](bool local) { return local; };
  // The same with the state on a device: ORs the other ranks' flags into `found_inf` in place (an all-reduce MAX),
  // without reading it. Identity by default.
  std::function<void(const Tensor& found_inf)> combine_overflow_on_device = [](const Tensor&) {};

 private:
  void update(bool overflow);

  GradScalerOptions options_;
  GradScalerState state_;
  bool unscaled_ = false;  // unscale_and_check ran for the current step
  bool overflow_ = false;  // its result
  // The state on a device: {scale, clean_steps, overflows_left, skipped_steps} (f64), the scale as f32 (what the
  // loss is multiplied by) and this step's overflow flag.
  Tensor device_state_, device_scale_, found_inf_;
};

}  // namespace minidl::optim
