// Optimizer: the base of minidl's optimizers (SGD, AdamW). It holds parameter groups and the learning rate.
//
//   auto groups = optim::decay_groups(model.named_parameters(), /*weight_decay=*/0.1);
//   optim::AdamW opt(groups, {.lr = 6e-4});
//   for (step...) {
//     opt.zero_grad();
//     loss.backward();
//     opt.set_lr(schedule(step));
//     opt.step();
//   }
//
// Contracts:
// - Parameters are f32, contiguous leaf tensors that require grad; a tensor may appear in only one group. A
//   parameter another scheme updates (ZeRO: its shard parameters are what an optimizer steps) is refused with the
//   scheme's message (AutogradMeta::update_owner).
// - step() updates every parameter that has a gradient (f32, contiguous, the parameter's numel) and skips one whose
//   gradient is undefined (no weight decay, no moment update), as PyTorch does for a parameter that took no part in
//   any backward. Optimizer state is flat and shares one step count (as ZeRO's flat shards do), so a skipped
//   parameter's bias correction later uses the shared count (PyTorch's AdamW counts steps per parameter).
// - zero_grad() zeroes gradients in place and keeps them allocated (it never resets them to undefined), so the
//   allocator sees the same buffers every step and backward accumulates into them.
// - The learning rate is one value for all groups (the schedule sets it); groups differ only by weight decay.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace minidl::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, double lr, const char* name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update using the current gradients.
  virtual void step() = 0;
  // step() unless found_inf (an i32 {1} flag, e.g. GradScaler::found_inf()) is set. This base reads the flag;
  // AdamW on a CUDA device decides in its kernel, without a host round trip (ops::fused_adamw_multi_unless_).
  virtual void step_unless(const Tensor& found_inf);
  // Sets every defined gradient to zero in place.
  void zero_grad();
  // step() then zero_grad(), with the same result; AdamW on the CPU zeroes each gradient in its update's pass
  // instead of in a pass of its own.
  virtual void step_and_zero_grad() {
    step();
    zero_grad();
  }

  void set_lr(double lr);
  double lr() const { return lr_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Total elements over all parameters: the length of a flat state buffer.
  int64_t numel() const { return numel_; }
  // The piece of a flat state buffer (numel() elements) that belongs to `param`, shaped like it; throws if `param`
  // is not one of this optimizer's parameters. What checkpoints use to store state per logical parameter.
  Tensor state_of(const Tensor& flat, const Tensor& param) const;

 protected:
  // A parameter with its group's weight decay and its offset (in elements) into flat state buffers, which hold
  // the parameters back to back in group order.
  struct Slot {
    Tensor param;
    double weight_decay;
    int64_t offset;
  };
  const std::vector<Slot>& slots() const { return slots_; }
  // The parameter's gradient, checked (f32, contiguous, same numel); undefined when it has none (skip it).
  Tensor grad_of(const Slot& slot) const;
  // The slot's piece of a flat buffer, shaped like the parameter.
  static Tensor slice(const Tensor& flat, const Slot& slot);
  // A zero-filled flat f32 buffer of numel() elements, charged to the optimizer-state ledger tag.
  Tensor zeros_state() const;

 private:
  std::vector<ParamGroup> groups_;
  std::vector<Slot> slots_;
  double lr_;
  int64_t numel_ = 0;
  const char* name_;  // for messages: "AdamW", "SGD"
};

// Splits named parameters into the two groups GPT-2/nanoGPT use: tensors with dim >= 2 (matrices, embeddings) get
// `weight_decay`; tensors with dim < 2 (biases, LayerNorm weights and biases) get none. Returns
// {decayed group, undecayed group}, each in the order the names were given; either may be empty.
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     double weight_decay);

}  // namespace minidl::optim
