#include "train/zero3_sync.h"

#include "optim/clip.h"
#include "train/zero_sync.h"

namespace minidl::train {

Zero3Sync::Zero3Sync(nn::GPT& model, const dist::Topology& topology, dist::Zero3Options options)
    : topology_(topology),
      zero_(model, topology.dp_group(), options),
      origin_(shard_origins(zero_.shard_params(), zero_.shard_owners(), zero_.reducer().params())) {}

Tensor Zero3Sync::origin(const Tensor& owned) const { return origin_in(origin_, owned); }

void Zero3Sync::before_backward(bool sync) {
  no_sync_.reset();
  if (!sync) no_sync_.emplace(zero_.reducer());
}

double Zero3Sync::grad_norm_squared(const std::vector<Tensor>& params) {
  const double mine = optim::grad_norm_squared(params);
  return sum_over(topology_.model_parallel_group(), sum_over(topology_.dp_group(), mine));
}

Tensor Zero3Sync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  const Tensor mine = optim::grad_norm_squared_tensor(params, device);
  return sum_over(topology_.model_parallel_group(), sum_over(topology_.dp_group(), mine));
}

void Zero3Sync::combine_overflow_on_device(const Tensor& found_inf) {
  max_over(topology_.model_parallel_group(), max_over(topology_.dp_group(), found_inf));
}

bool Zero3Sync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

nn::NamedTensors Zero3Sync::logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                          const KeepTensors& keep) {
  return gather_sharded_state(zero_.reducer(), zero_.shard_pieces(), zero_.shard_params(), opt, flat, model, keep);
}

void Zero3Sync::load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module&,
                                   const std::map<std::string, Tensor>& logical) {
  load_sharded_state(zero_.reducer(), zero_.shard_pieces(), zero_.shard_params(), opt, flat, logical);
}

}  // namespace minidl::train
