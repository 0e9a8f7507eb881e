// ZeRO stage 3 (Rajbhandari et al. 2020, "P_os+g+p"): the parameters are sharded too. Each of the N ranks of the
// group keeps 1/N of every block's parameters, with their gradients and AdamW state; a block's whole parameters
// exist only while the block runs. The model is any nn::BlockModule (nn/block_hooks.h): nn::GPT, whose blocks are
// its transformer blocks, or a module of one's own that names its blocks and runs each through run_block.
//
//   dist::ZeroStage3 zero(gpt, topology.dp_group());      // broadcasts rank 0's weights, shards, sets block hooks
//   optim::AdamW opt(zero.shard_groups(optim::decay_groups(gpt.named_parameters(), 0.1)), {.lr = 1e-3});
//   gpt.loss(x_slice, y_slice).backward();   // blocks gathered around their forward and backward, grads scattered
//   opt.step();                               // AdamW on the shard, in place
//   zero.gather_parameters();                 // the persistent parameters' all-gather; blocks gather when they run
//   opt.zero_grad();
//
// Units. Block i's parameters form one flat buffer of P_i = padded_numel(n_i, N) elements (laid out like a DDP
// bucket: reverse registration order). Rank r keeps elements [r·P_i/N, (r+1)·P_i/N) in a shard buffer of its own;
// the flat buffer's storage is allocated only while the block is gathered (Storage::release / reallocate): the
// parameters, and every view autograd saved of them, alias that one storage, so freeing it frees the block even
// though the graph still holds views, and re-gathering fills the same storage before backward reads it.
// Persistent parameters: those outside the blocks (GPT: wte, wpe, ln_f) stay whole on every rank, like stage 2 (their
// gradients and optimizer state sharded, an all-gather after the step). The threshold is structural rather than a
// byte count: BlockHooks fire only around blocks, so nothing could gather the embeddings and ln_f in time, and the
// tied wte is used at both ends of the model (embedding first, head last), so sharding it would gather it twice
// per pass for little gain at GPT sizes where 12·L·C² block parameters dominate V·C + T·C + 2C.
//
// Schedule (nn/block_hooks.h gives the order of the hooks):
//   forward  before_block(i): wait for block i (gathering it now unless prefetched), prefetch block i+1;
//            after_block(i): free block i.
//   backward before_block_backward(i): wait for block i, prefetch block i-1. Block i is freed (and its gradient
//            bucket reduce-scattered, by the Reducer) when the last of its parameters' gradient hooks has fired.
//            A recomputation (before_block(i, true) ... after_block(i, true)) runs inside that window: it finds
//            the block gathered and frees nothing, so a checkpointed block is gathered once for recompute and
//            backward, not twice.
// At most the block running and one prefetched block are gathered at any time. Every collective (the all-gathers
// and the Reducer's reduce-scatters) runs on the Reducer's communication thread, in the order the main thread
// queued them: the hooks fire in the same order on every rank, so the ranks pair the same collectives.
//
// Mixed precision: the gather is in f32 (the master weights), and stage 3 owns the 16-bit cast: the gathered
// block is cast once into a 16-bit flat buffer freed with the block, which autocast uses as its weight copies
// (autograd::autocast_provide) instead of caching 16-bit copies of the whole model. Gathering in 16 bits would
// halve the all-gather's bytes, but LayerNorm takes f32 weights under autocast and bitwise equality with DDP
// needs them exact; a 16-bit gather would need each block split into an f32 unit and a 16-bit unit.
//
// Gradient accumulation: as stages 1-2 (dist/zero.h), full gradients are kept until the last micro-batch, which
// reduce-scatters once (DDP's summation order, bitwise DDP); the blocks are gathered and freed in every
// micro-batch.
//
// Memory per rank, Ψ parameters of which Φ persistent, N ranks, AdamW, at rest (plus < N padding per unit):
//   params 4(Ψ−Φ)/N + 4Φ   grads 4Ψ/N   optimizer 8Ψ/N
// and during the step at most two gathered blocks (4·P_i each in f32, 6·P_i under --amp) plus the one gradient
// bucket being filled and reduce-scattered (4·P_i), and the persistent unit's gradient bucket (4Φ).
//
// Communication per step, per rank, with a ring (elements sent): every block is all-gathered twice (forward and
// backward: 2·(N−1)/N·(Ψ−Φ)) and its gradient reduce-scattered once ((N−1)/N·(Ψ−Φ)); the persistent unit costs
// a reduce-scatter and an all-gather as in stage 2 (2·(N−1)/N·Φ). In total 3·(N−1)/N·(Ψ−Φ) + 2·(N−1)/N·Φ
// against DDP's 2·(N−1)/N·Ψ: 1.5x DDP when Φ ≪ Ψ (the paper's figure), less when the persistent part is large.
// With grad accumulation over k micro-batches the blocks are gathered 2k times.
//
// Not thread-safe; the model must only run forward/backward on the thread that constructed this (autocast's
// cache is thread-local).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "dist/reducer.h"
#include "dist/zero.h"
#include "dist/zero_state.h"
#include "nn/block_hooks.h"
#include "optim/optimizer.h"

namespace minidl::dist {

// ZeRO-3's gradient buckets for `model`'s parameters (those that require grad, in named_parameters() order; the
// others are skipped, as the Reducer does): one per block the model holds (BlockModule::block_parameters: the model
// says which parameters make a block), latest block first, then one of the persistent parameters; each in reverse
// registration order. A pure function, so DDP can be given the same buckets. Throws if a block has no parameter
// that requires grad or two blocks name the same parameter.
std::vector<BucketSpec> block_buckets(const nn::BlockModule& model);

struct Zero3Options {
  // Broadcast rank 0's parameters and buffers at construction (off only for tests that build identical models).
  bool broadcast_at_start = true;
};

class ZeroStage3 final : public nn::BlockHooks, public ZeroShards {
 public:
  // All parameters that require grad must be contiguous f32 on the group's device. Installs itself as the
  // model's block hooks (and removes them in its destructor).
  ZeroStage3(nn::BlockModule& model, ProcessGroup& group, Zero3Options options = {});
  ~ZeroStage3() override;

  Reducer& reducer() override { return reducer_; }
  const Reducer& reducer() const override { return reducer_; }

  // After the optimizer step (or its skip): all-gathers the persistent unit. Blocks need nothing: their shards were
  // updated in place and are gathered when the blocks next run.
  void gather_parameters() override;

  // Collective: gathers every block and keeps them (hooks do nothing) until hold_full(false), for what must see
  // the whole model on ranks that may run different work: evaluation, sampling, saving.
  void hold_full(bool hold);

  // BlockHooks.
  void before_block(int64_t block, bool recompute) override;
  void after_block(int64_t block, bool recompute) override;
  void before_block_backward(int64_t block) override;

  // Elements: padded units (Ψ plus padding), the persistent parameters (Φ), block i's padded flat buffer (P_i).
  int64_t padded_numel() const;
  int64_t persistent_numel() const;
  int64_t block_padded_numel(int64_t block) const;
  // All-gathers of blocks since construction (tests: one per block per forward and per backward).
  int64_t block_gathers() const { return block_gathers_; }

 private:
  struct Unit {
    size_t bucket = 0;               // its gradient bucket in the Reducer
    Tensor flat;                     // P elements; a block's storage is allocated only while gathered
    Tensor shard;                    // P/N elements this rank keeps (a view of flat for the persistent unit)
    Tensor half;                     // 16-bit copy of flat under autocast (blocks only), allocated with it
    std::vector<Tensor> half_views;  // per parameter of the bucket, views of half
    bool gathered = false;
    std::shared_future<void> pending;  // a queued gather not yet waited for
    int grads_left = 0;                // parameters of the block whose gradient hook has not fired in this backward
  };
  Unit& block_unit(int64_t block);
  void prefetch(int64_t block);  // queues block's gather on the communication thread (if not gathered)
  void ensure_gathered(int64_t block);
  void release(int64_t block);
  void on_block_grad(int64_t block);

  nn::BlockModule& model_;
  int rank_, world_;
  int64_t first_block_, last_block_;
  std::vector<Unit> units_;  // blocks first_block_ .. last_block_-1, then the persistent unit
  bool hold_ = false;
  int64_t block_gathers_ = 0;
  DType half_dtype_ = DType::f32;      // the 16-bit dtype of the half copies made so far
  std::shared_ptr<ZeroStage3*> self_;  // what the parameters' gradient hooks point at (they hold a weak_ptr)
  Reducer reducer_;
};

}  // namespace minidl::dist
