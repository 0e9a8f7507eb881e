#include "train/zero_sync.h"

#include "optim/clip.h"

namespace minidl::train {

namespace {

dist::ZeroOptions with_stage(dist::ZeroOptions o, int stage) {
  o.stage = stage;
  return o;
}

}  // namespace

ZeroSync::ZeroSync(nn::Module& model, const dist::Topology& topology, int stage, dist::ZeroOptions options)
    : topology_(topology), zero_(model, topology.dp_group(), with_stage(options, stage)) {}

void ZeroSync::before_backward(bool sync) {
  no_sync_.reset();
  if (!sync) no_sync_.emplace(zero_.reducer());
}

std::vector<Tensor> ZeroSync::owned_params(const std::vector<Tensor>&) { return zero_.shard_params(); }

std::vector<optim::ParamGroup> ZeroSync::optimizer_groups(std::vector<optim::ParamGroup> groups) {
  return zero_.shard_groups(groups);
}

double ZeroSync::grad_norm_squared(const std::vector<Tensor>& params) {
  const double mine = optim::grad_norm_squared(params);
  return sum_over(topology_.model_parallel_group(), sum_over(topology_.dp_group(), mine));
}

bool ZeroSync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

}  // namespace minidl::train
