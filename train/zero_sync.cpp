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
    : topology_(topology), zero_(model, topology.dp_group(), with_stage(options, stage)), origin_(shard_origins(zero_.shard_params(), zero_.shard_owners(), zero_.reducer().params())) {}

std::unordered_map<const TensorImpl*, Tensor> shard_origins(const std::vector<Tensor>& shard_params,
                                                            const std::vector<size_t>& owners,
                                                            const std::vector<Tensor>& params) {
  std::unordered_map<const TensorImpl*, Tensor> out;
  for (size_t i = 0; i < shard_params.size(); ++i) out[shard_params[i].impl()] = params[owners[i]];
  return out;
}

Tensor origin_in(const std::unordered_map<const TensorImpl*, Tensor>& origins, const Tensor& owned) {
  auto it = origins.find(owned.impl());
  MINIDL_ASSERT(it != origins.end(), "ZeRO: a tensor that is not one of this rank's shard parameters");
  return it->second;
}

Tensor ZeroSync::origin(const Tensor& owned) const { return origin_in(origin_, owned); }

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

Tensor ZeroSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  const Tensor mine = optim::grad_norm_squared_tensor(params, device);
  return sum_over(topology_.model_parallel_group(), sum_over(topology_.dp_group(), mine));
}

void ZeroSync::combine_overflow_on_device(const Tensor& found_inf) {
  max_over(topology_.model_parallel_group(), max_over(topology_.dp_group(), found_inf));
}

bool ZeroSync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

nn::NamedTensors ZeroSync::logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                         const KeepTensors& keep) {
  return gather_sharded_state(zero_.reducer(), zero_.shard_pieces(), zero_.shard_params(), opt, flat, model, keep);
}

void ZeroSync::load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module&,
                                  const std::map<std::string, Tensor>& logical) {
  load_sharded_state(zero_.reducer(), zero_.shard_pieces(), zero_.shard_params(), opt, flat, logical);
}

nn::NamedTensors gather_sharded_state(dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                                      const std::vector<Tensor>& shard_params, const optim::Optimizer& opt,
                                      const Tensor& flat, const nn::Module& model, const KeepTensors& keep) {
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  return gather_sharded_state(reducer, pieces, shard_params, opt, flat, names, keep);
}

nn::NamedTensors gather_sharded_state(dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                                      const std::vector<Tensor>& shard_params, const optim::Optimizer& opt,
                                      const Tensor& flat, const std::vector<std::string>& names,
                                      const KeepTensors& keep) {
  std::vector<Tensor> values;
  for (const Tensor& p : shard_params) values.push_back(opt.state_of(flat, p));
  std::vector<bool> kept(reducer.params().size());
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = keep(reducer.names()[i]);
  std::vector<Tensor> whole = dist::gather_logical(reducer, pieces, values, kept);
  nn::NamedTensors out;
  if (keep.none()) return out;
  std::map<std::string, Tensor> by_name;
  for (size_t i = 0; i < whole.size(); ++i)
    if (kept[i]) by_name[reducer.names()[i]] = whole[i];
  for (const std::string& name : names) {
    if (!keep(name)) continue;
    auto it = by_name.find(name);
    MINIDL_ASSERT(it != by_name.end(), "ZeRO checkpoint: parameter ", name, " is in no bucket");
    out.emplace_back(name, it->second);
  }
  return out;
}

void load_sharded_state(const dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                        const std::vector<Tensor>& shard_params, const optim::Optimizer& opt, Tensor& flat,
                        const std::map<std::string, Tensor>& logical) {
  std::vector<Tensor> whole;
  for (const std::string& name : reducer.names()) whole.push_back(logical.at(name));
  std::vector<Tensor> mine = dist::slice_logical(reducer, pieces, whole);
  for (size_t i = 0; i < shard_params.size(); ++i) opt.state_of(flat, shard_params[i]).copy_(mine[i]);
}

}  // namespace minidl::train
