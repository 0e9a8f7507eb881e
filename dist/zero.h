// ZeRO stages 1 and 2 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", 2020): data parallelism in which each of the N ranks of the group keeps the optimizer state (stage 1)
// and also the reduced gradients (stage 2) of only its 1/N of the parameters. Every rank still holds every
// parameter (stage 3, which shards those too, is dist/zero3.h).
//
//   dist::ZeroDataParallel zero(model, topology.dp_group(), {.stage = 2});      // broadcasts rank 0's weights
//   optim::AdamW opt(zero.shard_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-3});
//   model.loss(x_slice, y_slice).backward();   // buckets reduce-scatter into this rank's shard during backward
//   opt.step();                                // AdamW on the shard only: m and v are 1/N of the model
//   zero.gather_parameters();                  // every rank gets every updated parameter back
//   opt.zero_grad();
//
// The pairing is checked: an optimizer over model.parameters() instead of the shard groups, and a backward after a
// step whose gather_parameters() was forgotten, throw naming the missing call (ZeroShards::claim_updates).
//
// Layout. Parameters are bucketed exactly as DDP buckets its gradients (dist/reducer.h, dist/bucketing.h), and a
// bucket of n elements is padded to P = padded_numel(n, N). The bucket's gradients and its parameters live in flat
// buffers of P elements with the same layout: the parameters are re-pointed into a flat parameter buffer
// (Tensor::set_data), so the all-gather writes them in place. Rank r owns elements [r·P/N, (r+1)·P/N) of every
// bucket, the same chunk the ring's reduce-scatter leaves on rank r. A shard may span several parameters, or parts
// of them, and end in padding; it is cut at parameter boundaries into *shard parameters*: leaf tensors viewing the
// flat parameter buffer whose .grad() views the reduced gradient shard. The optimizer, the loss scaler, clipping and
// the gradient norm see only those; padding belongs to none of them and stays zero. Sizes that do not divide by N
// are padded, never run unsharded.
//
// Stage 1: the gradient buckets are DDP's (persistent); each is reduce-scattered (average) into its own shard span
// as soon as its last gradient is in; the rest of the bucket keeps this rank's unreduced gradients until
// gather_parameters() zeroes it. Stage 2: a bucket's buffer lives only from its first gradient to the end of its
// reduce-scatter (ReducerOptions::release_buffers), which writes a persistent gradient shard of P/N elements.
//
// Gradient accumulation (no_sync): full gradients are kept until the last micro-batch, whose backward
// reduce-scatters once. Every micro-batch's gradient is added into the same local sum, in the same order as DDP,
// so the result is bitwise DDP's (the alternative, DeepSpeed's reduce-scatter every micro-batch, changes the
// summation order and costs k collectives). The price under stage 2: full gradients (4Ψ) live during the
// accumulating micro-batches, as ordinary gradient tensors.
//
// Memory per rank, Ψ f32 parameters, N ranks, AdamW (m and v: 8 bytes per parameter):
//   DDP       params 4Ψ   grads 4Ψ                    optimizer 8Ψ      = 16Ψ
//   stage 1   params 4Ψ   grads 4Ψ                    optimizer 8Ψ/N    = 8Ψ + 8Ψ/N
//   stage 2   params 4Ψ   grads 4Ψ/N (+ the buckets   optimizer 8Ψ/N    = 4Ψ + 12Ψ/N at rest
//                         in flight during backward)
// plus padding: at most N - 1 elements per bucket in the flat buffers.
//
// Communication per step, per rank, with a ring: DDP's all-reduce sends 2(N-1)/N·Ψ elements (reduce-scatter then
// all-gather). Stages 1 and 2 send the same: a reduce-scatter of the gradients ((N-1)/N·Ψ) during backward and an
// all-gather of the updated parameters ((N-1)/N·Ψ) after the step. Over "ring" both halves cut the buckets into
// the chunks the all-reduce uses and AdamW is elementwise, so stages 1 and 2 give DDP's weights bit for bit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dist/reducer.h"
#include "dist/zero_state.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minidl::dist {

// What ZeRO's stages (ZeroDataParallel: 1-2, ZeroStage3: 3) share: this rank's shard parameters and the reducer
// that reduce-scatters each bucket into them. The reducer itself stays a member of each stage, declared last so
// that it (and its communication thread) goes first when a stage is destroyed.
class ZeroShards {
 public:
  virtual ~ZeroShards();  // unmarks the parameters claim_updates marked
  virtual Reducer& reducer() = 0;
  virtual const Reducer& reducer() const = 0;
  // After the optimizer step (or its skip): every rank gets the updated parameters back (each stage's own way).
  virtual void gather_parameters() = 0;

  ProcessGroup& group() { return reducer().group(); }
  const std::vector<BucketSpec>& buckets() const { return reducer().buckets(); }
  const ReducerStats& last_step() const { return reducer().last_step(); }

  // This rank's shard of every bucket, cut at parameter boundaries. Their .grad() hold the gradient averaged over
  // the group after a synchronising backward.
  const std::vector<Tensor>& shard_params() const { return shard_params_; }
  // Where each shard parameter lies in its bucket (checkpoints: dist/zero_state.h).
  const std::vector<ShardPiece>& shard_pieces() const { return shard_pieces_; }
  // Shard parameter i is a piece of reducer().params()[shard_owners()[i]].
  const std::vector<size_t>& shard_owners() const { return shard_owner_; }
  // `groups` (over the module's parameters) turned into groups over the shard parameters: each shard parameter
  // gets the group (and weight decay) of the parameter it is a piece of. Groups left empty on this rank are dropped.
  std::vector<optim::ParamGroup> shard_groups(const std::vector<optim::ParamGroup>& groups) const;
  // Elements of this rank's shard parameters (its share of Ψ).
  int64_t shard_numel() const;

  using NoSyncGuard = Reducer::NoSyncGuard;
  [[nodiscard]] NoSyncGuard no_sync() { return reducer().no_sync(); }

 protected:
  // The pairing the caller must keep, checked instead of trusted. Every parameter the stage shards is marked as
  // updated by it, so an optimizer built over the parameters instead of shard_groups(...) throws naming the fix
  // (optim::Optimizer reads AutogradMeta::update_owner). And a reduction (a synchronising backward, or
  // reduce_scatter_gradients) while the previous one's update was never gathered throws naming
  // gather_parameters(): without it each rank keeps only its own shard's update and the weights drift apart.
  void claim_updates(const std::vector<Tensor>& params, const std::string& owner);
  void begin_reduction();  // throws if the last reduction was not followed by gather_parameters()
  void end_gather() { awaiting_gather_ = false; }
  std::function<void()> reduction_check() {
    return [this] { begin_reduction(); };
  }

  std::vector<Tensor> grad_shards_;  // per bucket: P/N elements (stage 1: a view of the bucket buffer)
  std::vector<Tensor> shard_params_;
  std::vector<size_t> shard_owner_;  // shard parameter -> index into reducer().params()
  std::vector<ShardPiece> shard_pieces_;

 private:
  std::vector<Tensor> claimed_;  // the parameters marked as updated by this stage (unmarked in the destructor)
  bool awaiting_gather_ = false;
};

struct ZeroOptions {
  int stage = 1;  // 1: optimizer state sharded; 2: gradients too
  BucketCaps caps;
  // Broadcast rank 0's parameters and buffers at construction (off only for tests that build identical models).
  bool broadcast_at_start = true;
};

class ZeroDataParallel final : public ZeroShards {
 public:
  // All parameters that require grad must be contiguous f32 on the group's device.
  ZeroDataParallel(nn::Module& module, ProcessGroup& group, ZeroOptions options = {});
  // The same over (name, parameter) pairs that no one module holds (a pipeline stage's chunks); no buffers.
  ZeroDataParallel(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroup& group,
                   ZeroOptions options = {});

  int stage() const { return options_.stage; }
  Reducer& reducer() override { return reducer_; }
  const Reducer& reducer() const override { return reducer_; }

  // After the optimizer step (or its skip): all-gathers every bucket's parameters from their owners, in place;
  // stage 1 also zeroes the gradient buckets (their non-shard part holds this rank's unreduced gradients).
  void gather_parameters() override;

  // For a caller that synchronises after backward rather than during it (a pipeline stage, whose backward is one
  // autograd call per micro-batch and chunk): with every backward run under no_sync, copies each parameter's
  // accumulated .grad() into its bucket, reduce-scatters (average) the buckets into this rank's gradient shards in
  // bucket order, and drops the full gradients (.grad() undefined until the next backward). No overlap with
  // backward; the same shards, the same optimizer and the same gather_parameters() as the hooked path.
  void reduce_scatter_gradients();

  // Elements of every padded bucket (Ψ plus padding).
  int64_t padded_numel() const;

 private:
  Tensor shard_of(const Tensor& flat) const;  // this rank's P/N elements of a flat bucket-sized buffer

  ZeroOptions options_;
  int rank_, world_;                 // in the group
  std::vector<Tensor> flat_params_;  // per bucket: P elements, the parameters are views of it
  Reducer reducer_;                  // last: destroyed first
};

}  // namespace minidl::dist
