#include "train/zero3_sync.h"

#include "optim/clip.h"

namespace minidl::train {

Zero3Sync::Zero3Sync(nn::GPT& model, const dist::Topology& topology, dist::Zero3Options options)
    : topology_(topology), zero_(model, topology.dp_group(), options) {}

void Zero3Sync::before_backward(bool sync) {
  no_sync_.reset();
  if (!sync) no_sync_.emplace(zero_.reducer());
}

double Zero3Sync::grad_norm_squared(const std::vector<Tensor>& params) {
  const double mine = optim::grad_norm_squared(params);
  return sum_over(topology_.model_parallel_group(), sum_over(topology_.dp_group(), mine));
}

bool Zero3Sync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

}  // namespace minidl::train
