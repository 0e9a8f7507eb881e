// GradSync: how a training step makes gradients consistent across ranks, for every layout, and the one place that
// knows which ranks hold which gradients (so it also combines the gradient norm for clipping and the fp16
// overflow flag).
//
//   train::Stage stage = train::Stage::of(model);
//   train::GradSync sync(stage, topology, {.zero = 2});   // ZeRO-2 over topology.dp_group()
//   optim::AdamW opt(sync.optimizer_groups(optim::decay_groups(stage.named_parameters(), 0.1)), {.lr = 1e-3});
//   train::StepOptions o;
//   o.grad_sync = &sync;
//   train::train_step(stage, opt, batch, o);              // unscale, clip and AdamW on this rank's shard
//
// One data-parallel engine per model chunk, over the dp group, told by the executor which backward is the chunk's
// last of the step (before_backward), so its buckets reduce while that backward runs, for pp > 1 too:
//   zero 0, dp > 1:  DDP (dist/ddp.h): every gradient averaged by bucketed all-reduces;
//   zero 1 or 2:     ZeroDataParallel (dist/zero.h): reduce-scattered into this rank's shard, the optimizer steps
//                    on the shard, after_step all-gathers the parameters (at dp 1 too: shards of the whole bucket);
//   zero 3:          ZeroStage3 (dist/zero3.h): the blocks' parameters sharded too, gathered per block.
// What remains pipeline-specific is the tied wte of the first and last stage: its two gradients are summed over the
// embedding group after the last backward, then averaged over dp; so DDP leaves it out of its buckets, and a ZeRO
// chunk holding it reduce-scatters after that sum instead of during the backward. With sequence parallelism the
// replicated parameters' gradients are partial sums over the tp group: all-reduced there after the last backward.
//
// The gradient norm counts each logical element once: the tied copy of wte is left out, ZeRO's shards are summed
// over dp, every stage and tp rank's part over the model-parallel group, and tp-replicated parameters count 1/tp on
// each tp rank. The overflow flag is the max over the dp and model-parallel groups.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dist/ddp.h"
#include "dist/topology.h"
#include "dist/zero.h"
#include "dist/zero3.h"
#include "optim/optimizer.h"
#include "train/stage.h"

namespace minidl::train {

// Which logical tensors (by parameter name) a rank keeps of a collective checkpoint gather: all (true), none
// (false), or those a predicate names (the tensors this rank writes: train/checkpoint.h's checkpoint_share).
class KeepTensors {
 public:
  KeepTensors(bool all) : all_(all) {}  // NOLINT: implicit, so `keep` may stay a bool where it is all or nothing
  explicit KeepTensors(std::function<bool(const std::string&)> owns) : owns_(std::move(owns)) {}
  bool operator()(const std::string& name) const { return owns_ ? owns_(name) : all_; }

 private:
  bool all_ = false;
  std::function<bool(const std::string&)> owns_;
};

struct SyncOptions {
  int zero = 0;                           // 0: DDP over dp (when dp > 1); 1, 2, 3: ZeRO's stage
  dist::BucketCaps caps;                  // bucket sizes (DDP and ZeRO)
  std::vector<dist::BucketSpec> buckets;  // DDP: an explicit assignment instead (tests give ZeRO-3's per block)
  bool broadcast_at_start = true;         // every dp rank starts from dp rank 0's weights
  dist::Compression compression = dist::Compression::kNone;  // DDP's bucket averages (dist/comm_hook.h)
  std::optional<dist::PowerSgdOptions> powersgd{};           // ... or PowerSGD's (dist/powersgd.h), per chunk
};

class GradSync {
 public:
  // One process: nothing to synchronise (no engine, no group). one_process() is a shared one, which no call writes:
  // what StepOptions start with.
  GradSync();
  static GradSync& one_process();
  // Collective over the topology's groups: the engines of `stage`'s chunks (which must be on their device: the
  // buckets follow the parameters).
  GradSync(const Stage& stage, const dist::Topology& topology, SyncOptions options = {});
  virtual ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // "none", "ddp", "zero1" ... with "+pipeline" and "+tp" where they apply.
  std::string name() const;
  // Before each backward of local chunk `chunk`; last: its last backward of the step, which reduces its buckets.
  virtual void before_backward(int chunk, bool last);
  // After the step's last backward.
  virtual void after_backward();
  // The tensors whose .grad() this rank owns after the last backward: what the loss scaler unscales, clipping
  // scales and the optimizer updates. `params` by default; ZeRO: this rank's shard of every chunk.
  std::vector<Tensor> owned_params(const std::vector<Tensor>& params) const;
  // The model parameter an element of owned_params is, or is a piece of (ZeRO's shard).
  Tensor origin(const Tensor& owned) const;
  // The optimizer's parameter groups given the model's (ZeRO: the same weight decays over the shard).
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) const;
  // After the optimizer step or its skip, before zero_grad (ZeRO: all-gather the updated parameters).
  void after_step();
  // Sum of the squares of every gradient element of the logical model, each counted once: this rank's part of
  // `params` (owned_params) combined with the parts other ranks hold. Identical on every rank.
  double grad_norm_squared(const std::vector<Tensor>& params) const;
  // Whether any rank that holds gradients saw an inf/NaN (the loss scaler's step is skipped on every rank).
  bool combine_overflow(bool local) const;
  // The same two on a CUDA device, without a host round trip (train::apply_step on a device): the sum of squares
  // as an f32 {1} tensor on `device`; the overflow flag (i32 {1}) maxed in place over the same ranks.
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) const;
  void combine_overflow_on_device(const Tensor& found_inf) const;
  // Communication time of the last step's synchronisation.
  dist::ReducerStats comm_stats() const;
  // Collective over the dp group: every parameter whole on this rank (true) for evaluation, sampling or saving,
  // or back to training's state (false). Only ZeRO-3 has something to do.
  void hold_full_parameters(bool hold);
  // Checkpoints: an optimizer state buffer over owned_params (`flat`, e.g. AdamW's m) as one tensor per parameter
  // of chunk v, shaped like this rank's parameter (a tp slice at tp > 1), those `keep` names, in the chunk's order.
  // ZeRO: collective over the dp group (the shards are all-gathered: dist/zero_state.h). load_state is the
  // inverse, local: `flat`'s owned pieces copied from `logical` (by name; ZeRO: this rank's slice of each).
  // `stage` is the one this GradSync synchronises (or any, for the one-process GradSync).
  nn::NamedTensors state(const optim::Optimizer& opt, const Tensor& flat, const Stage& stage, int v,
                         const KeepTensors& keep);
  void load_state(const optim::Optimizer& opt, Tensor& flat, const Stage& stage, int v,
                  const std::map<std::string, Tensor>& logical) const;
  // Chunk v's ZeRO engine (stage 1-2, stage 3), for what inspects its buffers (memory reports, tests).
  dist::ZeroDataParallel& zero(int v = 0) const;
  dist::ZeroStage3& zero3(int v = 0) const;

 private:
  struct Engine;  // one chunk's DDP or ZeRO
  // What the layout makes of this rank's gradients, set once by the constructor. One process is the same code with
  // none of it: no engine, no group, nothing tied or sliced, so every combination is the value itself.
  std::string name_ = "none";
  int zero_ = 0, tp_size_ = 1;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<dist::ProcessGroup*> norm_groups_;          // the gradient norm's squares are summed over these, in order
  std::vector<dist::ProcessGroup*> overflow_groups_;      // the overflow flag is maxed over these
  dist::ProcessGroup* tied_group_ = nullptr;              // the embedding group, where this stage holds the tied wte
  dist::ProcessGroup* dp_ = nullptr;                      // the tied wte's average over dp (DDP), after its sum
  dist::ProcessGroup* tp_group_ = nullptr;                // the sequence-sliced gradients' sum over tp
  dist::ProcessGroup* ep_group_ = nullptr;                // expert parallelism's (ep > 1): the experts' norm
  std::vector<Tensor> expert_params_;                     // the routed experts' parameters this rank holds
  std::unordered_set<const TensorImpl*> expert_impls_;    // ... as a set (the norm splits every step's params by it)
  Tensor tied_, tied_copy_;                               // the stage's wte; its copy on the last stage (pp > 1)
  std::vector<Tensor> params_;                            // the stage's parameters
  bool sliced_ = false, pipelined_ = false;               // some parameter is sequence_sliced; pp > 1
  std::unordered_map<const TensorImpl*, Tensor> origin_;  // ZeRO: shard parameter -> its parameter
  double pipeline_ms_ = 0;                                // the tied wte's synchronisation, last step

  // grad_norm_squared on the host (T = double) or on `device` (T = Tensor).
  template <class T>
  T norm_squared(const std::vector<Tensor>& params, Device device) const;
};

// Sum (resp. max) of one number over a group, on the group's device; the value itself when the group has one rank.
double sum_over(dist::ProcessGroup& group, double value);
double max_over(dist::ProcessGroup& group, double value);
// The same for a device tensor, in place and without reading it (nothing to do when the group has one rank);
// returns `t`.
const Tensor& sum_over(dist::ProcessGroup& group, const Tensor& t);
const Tensor& max_over(dist::ProcessGroup& group, const Tensor& t);

}  // namespace minidl::train
