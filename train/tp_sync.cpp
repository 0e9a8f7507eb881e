#include "train/tp_sync.h"

#include "optim/clip.h"

namespace minidl::train {

TensorParallelSync::TensorParallelSync(std::unique_ptr<GradSync> inner, const dist::TensorParallelGPT& model,
                                       const dist::Topology& topology)
    : inner_(std::move(inner)), model_(model), topology_(topology) {
  for (const Tensor& p : model.replicated_parameters()) replicated_.insert(p.impl());
  if (model.sequence_parallel() && topology.tp_group().size() > 1) sequence_parallel_params_ = model.replicated_parameters();
}

void TensorParallelSync::after_backward() {
  inner_->after_backward();
  if (sequence_parallel_params_.empty()) return;
  // One all-reduce over a flat copy of every partial gradient (a few LayerNorm-sized vectors and wpe).
  std::vector<Tensor> grads;
  for (const Tensor& p : sequence_parallel_params_)
    if (p.grad().defined()) grads.push_back(p.grad());
  dist::all_reduce_sum(grads, topology_.tp_group());
}

double TensorParallelSync::grad_norm_squared(const std::vector<Tensor>& params) {
  std::vector<Tensor> split, replicated;
  for (const Tensor& p : params) (replicated_.count(p.impl()) ? replicated : split).push_back(p);
  const double tp = topology_.grid().tp;
  return sum_over(topology_.model_parallel_group(),
                  optim::grad_norm_squared(split) + optim::grad_norm_squared(replicated) / tp);
}

bool TensorParallelSync::combine_overflow(bool local) {
  return max_over(topology_.model_parallel_group(), inner_->combine_overflow(local) ? 1.0 : 0.0) > 0;
}

nn::NamedTensors TensorParallelSync::logical_state(const optim::Optimizer& opt, const Tensor& flat,
                                                  const nn::Module& model, const KeepTensors& keep) {
  // Every rank of the tp group needs its slices for the all-gathers, whatever it keeps.
  return model_.gather_whole(inner_->logical_state(opt, flat, model, /*keep=*/true),
                             [&keep](const std::string& name) { return keep(name); });
}

void TensorParallelSync::load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                                            const std::map<std::string, Tensor>& logical) {
  std::map<std::string, Tensor> mine;
  for (const auto& [name, p] : model.named_parameters()) mine[name] = model_.layout(name).slice(logical.at(name));
  inner_->load_logical_state(opt, flat, model, mine);
}

}  // namespace minidl::train
