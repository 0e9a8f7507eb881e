#include "train/tp_sync.h"

#include <typeinfo>

#include "ops/elementwise.h"
#include "optim/clip.h"

namespace minidl::train {

TensorParallelSync::TensorParallelSync(std::unique_ptr<GradSync> inner, const dist::TensorParallelGPT& model,
                                       const dist::Topology& topology)
    : TensorParallelSync(std::move(inner), model.parameters(), model.replicated_parameters(), model.sequence_parallel(),
                         topology) {
  model_ = &model;
}

TensorParallelSync::TensorParallelSync(std::unique_ptr<GradSync> inner, std::vector<Tensor> params,
                                       const std::vector<Tensor>& replicated, bool sequence_parallel,
                                       const dist::Topology& topology)
    : inner_(std::move(inner)),
      topology_(topology),
      params_(std::move(params)),
      sequence_parallel_(sequence_parallel && topology.tp_group().size() > 1) {
  for (const Tensor& p : replicated) replicated_.insert(p.impl());
  // The norm below adds the inner strategy's sums, which must span the tp group: a plain GradSync (one process's)
  // spans nothing, so the tp-only case gets ModelParallelSync's sum over the model-parallel group.
  if (typeid(*inner_) == typeid(GradSync)) inner_ = std::make_unique<ModelParallelSync>(topology);
}

void TensorParallelSync::after_backward() {
  inner_->after_backward();
  if (!sequence_parallel_) return;
  // One all-reduce over a flat copy of every partial gradient (a few LayerNorm-sized vectors and wpe), or of
  // their ZeRO shards: the sum over tp of the average over dp is the average of the sums.
  std::vector<Tensor> grads;
  for (const Tensor& p : inner_->owned_params(params_))
    if (replicated_.count(inner_->origin(p).impl()) && p.grad().defined()) grads.push_back(p.grad());
  dist::all_reduce_sum(grads, topology_.tp_group());
}

double TensorParallelSync::grad_norm_squared(const std::vector<Tensor>& params) {
  std::vector<Tensor> split, replicated;
  for (const Tensor& p : params) (replicated_.count(inner_->origin(p).impl()) ? replicated : split).push_back(p);
  const double tp = topology_.grid().tp;
  // Two collectives of one number each, in the same order on every rank.
  const double split_sq = inner_->grad_norm_squared(split);
  return split_sq + inner_->grad_norm_squared(replicated) / tp;
}

Tensor TensorParallelSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> split, replicated;  // as grad_norm_squared, the sums staying on the device
  for (const Tensor& p : params) (replicated_.count(inner_->origin(p).impl()) ? replicated : split).push_back(p);
  const double tp = topology_.grid().tp;
  const Tensor split_sq = inner_->grad_norm_squared_on_device(split, device);
  return ops::add(split_sq, ops::mul(inner_->grad_norm_squared_on_device(replicated, device), 1.0 / tp));
}

void TensorParallelSync::combine_overflow_on_device(const Tensor& found_inf) {
  inner_->combine_overflow_on_device(found_inf);
  max_over(topology_.model_parallel_group(), found_inf);
}

bool TensorParallelSync::combine_overflow(bool local) {
  return max_over(topology_.model_parallel_group(), inner_->combine_overflow(local) ? 1.0 : 0.0) > 0;
}

nn::NamedTensors TensorParallelSync::logical_state(const optim::Optimizer& opt, const Tensor& flat,
                                                  const nn::Module& model, const KeepTensors& keep) {
  MINIDL_ASSERT(model_, "TensorParallelSync: a pipeline stage's checkpoint state goes through "
                "train/pipeline_checkpoint.h");
  // Every rank of the tp group needs its slices for the all-gathers, whatever it keeps.
  return model_->gather_whole(inner_->logical_state(opt, flat, model, /*keep=*/true),
                             [&keep](const std::string& name) { return keep(name); });
}

void TensorParallelSync::load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                                            const std::map<std::string, Tensor>& logical) {
  MINIDL_ASSERT(model_, "TensorParallelSync: a pipeline stage's checkpoint state goes through "
                "train/pipeline_checkpoint.h");
  std::map<std::string, Tensor> mine;
  for (const auto& [name, p] : model.named_parameters()) mine[name] = model_->layout(name).slice(logical.at(name));
  inner_->load_logical_state(opt, flat, model, mine);
}

}  // namespace minidl::train
