// Zero3Sync: ZeRO stage 3 as the gradient-synchronisation strategy of train_step (dist/zero3.h has the sharding,
// the schedule of gathers, the memory and the communication arithmetic).
//
//   train::Zero3Sync zero(gpt, topology);     // shards the blocks' parameters, installs the block hooks
//   optim::AdamW opt(zero.optimizer_groups(optim::decay_groups(gpt.named_parameters(), 0.1)), {.lr = 1e-3});
//   train::StepOptions o;
//   o.grad_sync = &zero;
//   train::train_step(gpt, opt, batch, o);    // unscale, clip and AdamW on the shard
//   zero.hold_full_parameters(true);          // collective: the whole model, for evaluation or saving
//
// The gradient norm and the overflow flag combine over the shards exactly as ZeroSync's (train/zero_sync.h).
#pragma once

#include <optional>
#include <unordered_map>

#include "dist/zero3.h"
#include "train/grad_sync.h"

namespace minidl::train {

class Zero3Sync : public GradSync {
 public:
  Zero3Sync(nn::GPT& model, const dist::Topology& topology, dist::Zero3Options options = {});
  const char* name() const override { return "zero3"; }
  void before_backward(bool sync) override;
  void after_backward() override { no_sync_.reset(); }
  std::vector<Tensor> owned_params(const std::vector<Tensor>&) override { return zero_.shard_params(); }
  Tensor origin(const Tensor& owned) const override;
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) override {
    return zero_.shard_groups(groups);
  }
  void after_step() override { zero_.gather_parameters(); }
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return zero_.last_step(); }
  void hold_full_parameters(bool hold) override { zero_.hold_full(hold); }
  nn::NamedTensors logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                 const KeepTensors& keep) override;
  void load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                          const std::map<std::string, Tensor>& logical) override;
  dist::ZeroStage3& zero() { return zero_; }

 private:
  const dist::Topology& topology_;
  dist::ZeroStage3 zero_;
  std::optional<dist::Reducer::NoSyncGuard> no_sync_;
  std::unordered_map<const TensorImpl*, Tensor> origin_;  // shard parameter -> the parameter it is a piece of
};

}  // namespace minidl::train
