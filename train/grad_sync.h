// GradSync: how a training step makes gradients consistent across ranks — the strategy train_step calls around
// backward, and the one place that knows which ranks hold which gradients (so it also combines the gradient norm
// for clipping and the fp16 overflow flag).
//
//   train::DDPSync ddp(model, topology);        // DDP over topology.dp_group()
//   train::StepOptions o;
//   o.grad_sync = &ddp;
//   train::train_step(model, optimizer, batch, o);
//
// Strategies: none (one process: the defaults below), DDP (here), ZeRO-1/2 (train/zero_sync.h: the optimizer
// steps on this rank's shard, the norm adds up every shard once).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/topology.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minidl::train {

// Which logical tensors (by parameter name) a rank keeps of a collective checkpoint gather: all (true), none
// (false), or those a predicate names (the tensors this rank writes: train/checkpoint.h's checkpoint_owner).
class KeepTensors {
 public:
  KeepTensors(bool all) : all_(all) {}  // NOLINT: implicit, so `keep` may stay a bool where it is all or nothing
  explicit KeepTensors(std::function<bool(const std::string&)> owns) : owns_(std::move(owns)) {}
  bool operator()(const std::string& name) const { return owns_ ? owns_(name) : all_; }
  bool none() const { return !owns_ && !all_; }

 private:
  bool all_ = false;
  std::function<bool(const std::string&)> owns_;
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual const char* name() const { return "none"; }
  // Before each micro-batch's backward. sync: this is the step's last backward, which must leave every rank with
  // the synchronised gradients; the earlier ones only accumulate locally.
  virtual void before_backward(bool /*sync*/) {}
  // After the step's last backward.
  virtual void after_backward() {}
  // The tensors whose .grad() this rank owns after the last backward: what the loss scaler unscales, clipping
  // scales and the optimizer updates. Every parameter by default; ZeRO: this rank's shard.
  virtual std::vector<Tensor> owned_params(const std::vector<Tensor>& params) { return params; }
  // The model parameter an element of owned_params is (by default), or is a piece of (ZeRO: the parameter its
  // shard was cut from): what a decorator such as TensorParallelSync classifies owned gradients by.
  virtual Tensor origin(const Tensor& owned) const { return owned; }
  // The optimizer's parameter groups given the model's (ZeRO: the same weight decays over the shard).
  virtual std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) { return groups; }
  // After the optimizer step or its skip, before zero_grad (ZeRO: all-gather the updated parameters).
  virtual void after_step() {}
  // Sum of the squares of every gradient element of the logical model, each counted once: this rank's part of
  // `params` (owned_params) combined with the parts other ranks hold. Identical on every rank.
  virtual double grad_norm_squared(const std::vector<Tensor>& params);
  // Whether any rank that holds gradients saw an inf/NaN (the loss scaler's step is skipped on every rank).
  virtual bool combine_overflow(bool local) { return local; }
  // The same two on a CUDA device, without a host round trip (train::apply_step on a device): the sum of squares
  // as an f32 {1} tensor on `device`, combined over the same groups by all-reduces of that tensor; the overflow
  // flag (i32 {1}) ORed in place over the same ranks as combine_overflow.
  virtual Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device);
  virtual void combine_overflow_on_device(const Tensor& /*found_inf*/) {}
  // Communication time of the last synchronising backward.
  virtual dist::ReducerStats comm_stats() const { return {}; }
  // Collective over the dp group: every parameter whole on this rank (true) for evaluation, sampling or saving,
  // or back to training's state (false). Only ZeRO-3 has something to do (train/zero3_sync.h).
  virtual void hold_full_parameters(bool /*hold*/) {}
  // Checkpoints. An optimizer state buffer over owned_params (`flat`: Optimizer::numel() elements, e.g. AdamW's m)
  // as one tensor per logical parameter of `model`, by name, in named_parameters() order. ZeRO: collective over the
  // dp group (the shards are all-gathered, dist/zero_state.h); a rank takes part whatever it keeps, and gets the
  // tensors `keep` names (in named_parameters() order).
  virtual nn::NamedTensors logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                         const KeepTensors& keep);
  // The inverse, local: `flat`'s owned pieces copied from `logical` (by name, shaped like the parameters; ZeRO:
  // this rank's slice of each, the padding left as it is).
  virtual void load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                                  const std::map<std::string, Tensor>& logical);
};

// Data parallelism: every rank holds the whole model; gradients are averaged over the dp group by DDP's bucketed
// all-reduce during the last backward (no_sync before it). After it every dp rank holds the same gradients, so the
// norm needs no data-parallel communication; it is summed over the model-parallel group (tp · pp ranks: each
// holds a different part of the model), and the overflow flag is combined over both.
class DDPSync final : public GradSync {
 public:
  DDPSync(nn::Module& model, const dist::Topology& topology, dist::DDPOptions options = {});
  const char* name() const override { return "ddp"; }
  void before_backward(bool sync) override;
  void after_backward() override { no_sync_.reset(); }
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return ddp_.last_step(); }
  dist::DistributedDataParallel& ddp() { return ddp_; }

 private:
  const dist::Topology& topology_;
  dist::DistributedDataParallel ddp_;
  std::optional<dist::Reducer::NoSyncGuard> no_sync_;
};

// No data parallelism (dp 1) but model parallelism (tp · pp ranks hold different parts of the model): nothing to
// synchronise, the norm is summed and the overflow flag combined over the model-parallel group.
class ModelParallelSync final : public GradSync {
 public:
  explicit ModelParallelSync(const dist::Topology& topology) : topology_(topology) {}
  const char* name() const override { return "model-parallel"; }
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;

 private:
  const dist::Topology& topology_;
};

// Sum (resp. max) of one number over a group, on the group's device; the value itself when the group has one rank.
double sum_over(dist::ProcessGroup& group, double value);
double max_over(dist::ProcessGroup& group, double value);
// The same for a device tensor, in place and without reading it (nothing to do when the group has one rank);
// returns `t`.
const Tensor& sum_over(dist::ProcessGroup& group, const Tensor& t);
const Tensor& max_over(dist::ProcessGroup& group, const Tensor& t);

}  // namespace minidl::train
