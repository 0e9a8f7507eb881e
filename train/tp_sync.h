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
//
// The inner strategy may shard (ZeRO 1-2 over the dp group: every tp rank's buckets have the same shapes, so their
// shards line up) or be a pipeline stage's (PipelineSync): the owned gradients are classified by GradSync::origin,
// and the norm is the inner strategy's (which counts its own duplicates once, e.g. the pipeline's second wte) of
// the split ones plus 1/tp of the inner strategy's of the replicated ones.
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
  // The same over any set of tensor-parallel parameters (a pipeline stage's chunks): `params` all of them,
  // `replicated` those every tp rank holds whole.
  TensorParallelSync(std::unique_ptr<GradSync> inner, std::vector<Tensor> params, const std::vector<Tensor>& replicated,
                     bool sequence_parallel, const dist::Topology& topology);
  const char* name() const override { return "tp"; }
  void before_backward(bool sync) override { inner_->before_backward(sync); }
  void after_backward() override;
  std::vector<Tensor> owned_params(const std::vector<Tensor>& params) override { return inner_->owned_params(params); }
  Tensor origin(const Tensor& owned) const override { return inner_->origin(owned); }
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) override {
    return inner_->optimizer_groups(std::move(groups));
  }
  void after_step() override { inner_->after_step(); }
  void hold_full_parameters(bool hold) override { inner_->hold_full_parameters(hold); }
  // The inner norm (summed over the dp and model-parallel groups) of the split parameters' gradients plus 1/tp of
  // the inner norm of the replicated ones: each logical element once (the replicated ones tp times 1/tp).
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  // Over the dp group (the inner strategy) and the model-parallel group: every rank skips the same steps.
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return inner_->comm_stats(); }
  // The strategy this one decorates.
  GradSync& inner() { return *inner_; }
  // Checkpoints store the logical (one-process) tensors: the inner strategy's per-parameter state of this rank's
  // slices, gathered over the tp group (q/k/v re-interleaved, vocabulary padding dropped: TensorParallelGPT::
  // gather_whole). Collective over the tp group (and whatever the inner strategy needs). Loading slices each
  // logical tensor back (padding zero) and hands the slices to the inner strategy; local. Needs the whole-model
  // constructor: a pipeline stage's tensor-parallel chunks are checkpointed by train/pipeline_checkpoint.h, which
  // gathers over the tp group chunk by chunk and reads the inner PipelineSync's state (inner()).
  nn::NamedTensors logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                 const KeepTensors& keep) override;
  void load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                          const std::map<std::string, Tensor>& logical) override;

 private:
  std::unique_ptr<GradSync> inner_;
  const dist::TensorParallelGPT* model_ = nullptr;  // the whole-model constructor's (checkpoints)
  const dist::Topology& topology_;
  std::vector<Tensor> params_;  // the model's (what owned_params is asked for)
  std::unordered_set<const TensorImpl*> replicated_;
  bool sequence_parallel_ = false;  // the replicated parameters' gradients are partial sums over the tp group
};

}  // namespace minidl::train
