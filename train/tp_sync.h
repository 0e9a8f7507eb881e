// TensorParallelSync: tensor parallelism around another gradient-synchronisation strategy (none or DDP over the dp
// group). Inside a tp group the gradients need no synchronisation of their own: split parameters' gradients are
// each rank's own, replicated parameters' are equal on every rank (the f/g operators of dist/tensor_parallel.h make
// them so). What changes is the gradient norm: a replicated parameter is held tp times but must count once. With
// sequence parallelism the replicated parameters (LayerNorms, wpe, row-parallel biases) act on this rank's
// positions only, so after the last backward their gradients are all-reduced (sum) over the tp group.
//
//   dist::TensorParallelGPT model(cfg, seed, topology.tp_group());
//   train::TensorParallelSync sync(std::make_unique<train::DDPSync>(model, topology), model, topology);
//   o.grad_sync = &sync;   // train_step as usual
#pragma once

#include <memory>
#include <unordered_set>

#include "dist/tp_gpt.h"
#include "train/grad_sync.h"

namespace minidl::train {

class TensorParallelSync final : public GradSync {
 public:
  TensorParallelSync(std::unique_ptr<GradSync> inner, const dist::TensorParallelGPT& model,
                     const dist::Topology& topology);
  const char* name() const override { return "tp"; }
  void before_backward(bool sync) override { inner_->before_backward(sync); }
  void after_backward() override;
  std::vector<Tensor> owned_params(const std::vector<Tensor>& params) override { return inner_->owned_params(params); }
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) override {
    return inner_->optimizer_groups(std::move(groups));
  }
  void after_step() override { inner_->after_step(); }
  // sum over the model-parallel group of (split parameters' squares + replicated parameters' squares / tp): each
  // logical element once (the replicated ones tp times 1/tp), and also right when the group spans pipeline stages.
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  // Over the dp group (the inner strategy) and the model-parallel group: every rank skips the same steps.
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return inner_->comm_stats(); }

 private:
  std::unique_ptr<GradSync> inner_;
  const dist::Topology& topology_;
  std::unordered_set<const TensorImpl*> replicated_;
  std::vector<Tensor> sequence_parallel_params_;  // replicated parameters whose gradients are partial sums
};

}  // namespace minidl::train
