#include "train/tp_sync.h"

#include "ops/elementwise.h"
#include "optim/clip.h"

namespace minidl::train {

TensorParallelSync::TensorParallelSync(std::unique_ptr<GradSync> inner, const dist::TensorParallelGPT& model,
                                       const dist::Topology& topology)
    : inner_(std::move(inner)), topology_(topology) {
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

Tensor TensorParallelSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> split, replicated;
  for (const Tensor& p : params) (replicated_.count(p.impl()) ? replicated : split).push_back(p);
  const double tp = topology_.grid().tp;
  const Tensor local = ops::add(optim::grad_norm_squared_tensor(split, device),
                                ops::mul(optim::grad_norm_squared_tensor(replicated, device), 1.0 / tp));
  return sum_over(topology_.model_parallel_group(), local);
}

void TensorParallelSync::combine_overflow_on_device(const Tensor& found_inf) {
  inner_->combine_overflow_on_device(found_inf);
  max_over(topology_.model_parallel_group(), found_inf);
}

bool TensorParallelSync::combine_overflow(bool local) {
  return max_over(topology_.model_parallel_group(), inner_->combine_overflow(local) ? 1.0 : 0.0) > 0;
}

}  // namespace minidl::train
