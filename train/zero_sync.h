// ZeroSync: ZeRO stage 1 or 2 as the gradient-synchronisation strategy of train_step (dist/zero.h has the
// sharding, the memory and the communication arithmetic).
//
//   train::ZeroSync zero(model, topology, /*stage=*/2);
//   optim::AdamW opt(zero.optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-3});
//   train::StepOptions o;
//   o.grad_sync = &zero;
//   train::train_step(model, opt, batch, o);   // unscale, clip and AdamW on the shard; then the all-gather
//
// After the last backward each dp rank owns the averaged gradients of its shard only, so the gradient norm is the
// sum of squares over the shard, summed over the dp group (the shards cut every bucket once; padding is zero and
// in no shard) and over the model-parallel group; the fp16 overflow flag is the max over both.
#pragma once

#include <optional>
#include <unordered_map>

#include "dist/zero.h"
#include "train/grad_sync.h"

namespace minidl::train {

class ZeroSync : public GradSync {
 public:
  ZeroSync(nn::Module& model, const dist::Topology& topology, int stage, dist::ZeroOptions options = {});
  const char* name() const override { return zero_.stage() == 1 ? "zero1" : "zero2"; }
  void before_backward(bool sync) override;
  void after_backward() override { no_sync_.reset(); }
  std::vector<Tensor> owned_params(const std::vector<Tensor>& params) override;
  Tensor origin(const Tensor& owned) const override;
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) override;
  void after_step() override { zero_.gather_parameters(); }
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return zero_.last_step(); }
  nn::NamedTensors logical_state(const optim::Optimizer& opt, const Tensor& flat, const nn::Module& model,
                                 const KeepTensors& keep) override;
  void load_logical_state(const optim::Optimizer& opt, Tensor& flat, const nn::Module& model,
                          const std::map<std::string, Tensor>& logical) override;
  dist::ZeroDataParallel& zero() { return zero_; }

 private:
  const dist::Topology& topology_;
  dist::ZeroDataParallel zero_;
  std::optional<dist::Reducer::NoSyncGuard> no_sync_;
  std::unordered_map<const TensorImpl*, Tensor> origin_;  // shard parameter -> the parameter it is a piece of
};

// Shard parameter -> the parameter it was cut from (GradSync::origin): shard_params[i] is a piece of
// params[owners[i]] (ZeRO 1-3's shard_params(), shard_owners() and reducer().params()).
std::unordered_map<const TensorImpl*, Tensor> shard_origins(const std::vector<Tensor>& shard_params,
                                                            const std::vector<size_t>& owners,
                                                            const std::vector<Tensor>& params);
// A shard parameter's origin in such a map; an internal error for any other tensor.
Tensor origin_in(const std::unordered_map<const TensorImpl*, Tensor>& origins, const Tensor& owned);

// ZeRO 1-3's checkpoint state (GradSync::logical_state and load_logical_state) over a reducer's buckets and the
// shard parameters cut from them (dist/zero_state.h); ZeroSync's and Zero3Sync's.
nn::NamedTensors gather_sharded_state(dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                                      const std::vector<Tensor>& shard_params, const optim::Optimizer& opt,
                                      const Tensor& flat, const nn::Module& model, const KeepTensors& keep);
// The same in the order of `names` (the parameters of something that is not one nn::Module: a pipeline stage's
// chunks, train/pipeline_checkpoint.h).
nn::NamedTensors gather_sharded_state(dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                                      const std::vector<Tensor>& shard_params, const optim::Optimizer& opt,
                                      const Tensor& flat, const std::vector<std::string>& names,
                                      const KeepTensors& keep);
void load_sharded_state(const dist::Reducer& reducer, const std::vector<dist::ShardPiece>& pieces,
                        const std::vector<Tensor>& shard_params, const optim::Optimizer& opt, Tensor& flat,
                        const std::map<std::string, Tensor>& logical);

}  // namespace minidl::train
