#include "train/grad_sync.h"

#include "optim/clip.h"

namespace minidl::train {

namespace {

double reduce_one(dist::ProcessGroup& group, double value, dist::ReduceOp op) {
  if (group.size() == 1) return value;
  Tensor t = Tensor::full({1}, value, DType::f64, group.device());
  group.all_reduce(t, op)->wait();
  return t.item();
}

}  // namespace

double sum_over(dist::ProcessGroup& group, double value) { return reduce_one(group, value, dist::ReduceOp::kSum); }
double max_over(dist::ProcessGroup& group, double value) { return reduce_one(group, value, dist::ReduceOp::kMax); }

const Tensor& sum_over(dist::ProcessGroup& group, const Tensor& t) {
  Tensor shared = t;  // a handle on the same data
  if (group.size() > 1) group.all_reduce(shared, dist::ReduceOp::kSum)->wait();
  return t;
}

const Tensor& max_over(dist::ProcessGroup& group, const Tensor& t) {
  Tensor shared = t;
  if (group.size() > 1) group.all_reduce(shared, dist::ReduceOp::kMax)->wait();
  return t;
}

double GradSync::grad_norm_squared(const std::vector<Tensor>& params) { return optim::grad_norm_squared(params); }

Tensor GradSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  return optim::grad_norm_squared_tensor(params, device);
}

nn::NamedTensors GradSync::logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                         const KeepTensors& keep) {
  nn::NamedTensors out;
  for (const auto& [name, p] : model.named_parameters())
    if (keep(name)) out.emplace_back(name, opt.state_of(flat, p));
  return out;
}

void GradSync::load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                                  const std::map<std::string, Tensor>& logical) {
  for (const auto& [name, p] : model.named_parameters()) opt.state_of(flat, p).copy_(logical.at(name));
}

DDPSync::DDPSync(nn::Module& model, const dist::Topology& topology, dist::DDPOptions options)
    : topology_(topology), ddp_(model, topology.dp_group(), options) {}

void DDPSync::before_backward(bool sync) {
  no_sync_.reset();
  if (!sync) no_sync_.emplace(ddp_.reducer());
}

double DDPSync::grad_norm_squared(const std::vector<Tensor>& params) {
  return sum_over(topology_.model_parallel_group(), optim::grad_norm_squared(params));
}

Tensor DDPSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  return sum_over(topology_.model_parallel_group(), optim::grad_norm_squared_tensor(params, device));
}

void DDPSync::combine_overflow_on_device(const Tensor& found_inf) {
  max_over(topology_.model_parallel_group(), max_over(topology_.dp_group(), found_inf));
}

bool DDPSync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

double ModelParallelSync::grad_norm_squared(const std::vector<Tensor>& params) {
  return sum_over(topology_.model_parallel_group(), optim::grad_norm_squared(params));
}

bool ModelParallelSync::combine_overflow(bool local) {
  return max_over(topology_.model_parallel_group(), local ? 1.0 : 0.0) > 0;
}

Tensor ModelParallelSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  return sum_over(topology_.model_parallel_group(), optim::grad_norm_squared_tensor(params, device));
}

void ModelParallelSync::combine_overflow_on_device(const Tensor& found_inf) {
  max_over(topology_.model_parallel_group(), found_inf);
}

}  // namespace minidl::train
