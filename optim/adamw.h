// AdamW (Loshchilov & Hutter), matching torch.optim.AdamW: decoupled weight decay, bias-corrected moments.
// The update itself is ops::fused_adamw_ (ops/adamw.h); this class owns the state and the step count.
//
// State is flat: one m and one v buffer of numel() elements for all parameters (back to back in group order,
// each parameter flattened row-major), allocated under the kOptimizer ledger tag. Each step calls the fused kernel
// once per parameter on its slice.
//
//   auto groups = optim::decay_groups(model.named_parameters(), 0.1);   // no decay on biases and LayerNorms
//   optim::AdamW opt(groups, {.lr = 1e-3});                              // betas 0.9/0.999, eps 1e-8
//   opt.step();
//   optim::AdamWState s = opt.state();                                   // for checkpoints
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "optim/optimizer.h"

namespace minidl::optim {

// Weight decay is not here: it belongs to each ParamGroup (0 unless given there).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// What a checkpoint saves. m and v are flat f32 tensors of Optimizer::numel() elements (layout above); step is
// the number of steps taken so far.
struct AdamWState {
  int64_t step = 0;
  Tensor m;
  Tensor v;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
  void step() override;
  void step_and_zero_grad() override;
  // On a CUDA device the kernel skips on the flag itself (nothing read back); the step count then lives partly on
  // the device (skipped steps), and state() reads it. On the CPU: Optimizer::step_unless.
  void step_unless(const Tensor& found_inf) override;
  const AdamWOptions& options() const { return options_; }

  // The live state (m and v share storage with the optimizer: copy them before changing them).
  // With steps skipped on the device (step_unless), reading the step count synchronises.
  AdamWState state() const;
  // Copies a saved state in; m and v must have numel() elements.
  void load_state(const AdamWState& state);

  // For a step captured in a CUDA graph (train/cuda_graph.h), whose replays the host does not see. Before the
  // warm-up: keep_step_count_on(device) puts the step count's device part in place (a step then always computes
  // its bias correction on the device, as step_unless does). Inside the capture, right before the step() or
  // step_unless() captured: count_next_step_on_device() records a device increment of the count (the device part
  // is "skipped steps minus steps counted on the device") and takes the captured call back from the host's count,
  // so each replay advances the bias correction by one step and state().step stays exact.
  void keep_step_count_on(Device device);
  void count_next_step_on_device();
  // After keep_step_count_on: every following step reads its learning rate from `lr` (an f64 {1} tensor on that
  // device) when it runs, not lr(): a captured step's rate, which the caller writes before each replay.
  void read_lr_from(const Tensor& lr);

 private:
  using GroupFn = std::function<void(std::vector<Tensor>& params, std::vector<Tensor>& grads, std::vector<Tensor>& m,
                                     std::vector<Tensor>& v, double weight_decay)>;
  // fn once per run of parameters with the same weight decay (a group) that have gradients.
  void for_each_group(const GroupFn& fn);
  void step_zeroing(bool zero_grads);

  AdamWOptions options_;
  int64_t step_ = 0;     // steps taken, or with skipped_ defined, step_unless calls on the device
  Tensor skipped_;       // i64 {1} on the device: the calls of step_unless that skipped
  Tensor lr_on_device_;  // read_lr_from
  Tensor m_, v_;
};

}  // namespace minidl::optim
