// Naive ZeRO stage 3: the parameters are sharded too. Each of the N ranks keeps 1/N of every transformer block's
// weights (and their gradients and optimizer state); a block is whole only while it runs. Read after
// naive/zero1.h; the production version is dist/zero3.h.
//
//   dist::naive::Zero3 zero(gpt, group);           // broadcasts rank 0's weights, shards the blocks, sets the hooks
//   optim::SGD opt({{zero.parameters(), 0.0}}, {.lr = 0.1});   // block shards + the (whole) embeddings and ln_f
//   gpt.loss(x_slice, y_slice).backward();         // blocks gathered around their forward and backward
//   opt.step();                                    // updates the shards in place: nothing to gather afterwards
//
// The seam: nn::GPT calls BlockHooks around each block (nn/block_hooks.h): before_block / after_block around its
// forward, before_block_backward before its backward. Block i's parameters are views of one flat buffer of P_i
// elements (padded to a multiple of N); rank r keeps elements [r·P_i/N, (r+1)·P_i/N) in a shard of its own.
//   forward   before_block(i): all-gather the shards into the flat buffer;  after_block(i): free the buffer.
//   backward  before_block_backward(i): all-gather again (backward reads the weights: dx = dy·Wᵀ);
//             when the last of block i's parameters has its gradient (its grad-ready hook): reduce-scatter
//             (average) the block's flat gradient into the shard's gradient, drop the full gradient, free the block.
// Freeing releases the buffer's storage but keeps the object (Storage::release): the views autograd saved for
// backward alias it, so re-gathering refills exactly what backward will read. wte, wpe and ln_f stay whole on
// every rank, averaged as in naive DDP (an all-reduce in their grad-ready hook): the hooks fire around blocks only.
// Why it equals DDP: the same whole weights run; each shard gets the average of its gradient elements
// (reduce-scatter = the first half of DDP's all-reduce); the optimizer is elementwise, so updating each shard
// where it lives gives DDP's weights, and the next gather reassembles them.
// Per step, per rank, ring, block parameters Ψ: two all-gathers and a reduce-scatter, 3(N-1)/N·Ψ elements (1.5x
// DDP's); params, grads and optimizer state all 1/N (16Ψ/N with AdamW), plus the one or two blocks running.
// Limits: one backward per step (the shard gradient is overwritten), one weight decay per block shard. Production
// (dist/zero3.h) lifts both, prefetches block i+1 on a communication thread, gathers a recomputed block once.
#pragma once

#include <memory>
#include <unordered_set>
#include <vector>

#include "dist/process_group.h"
#include "dist/shard.h"
#include "nn/block_hooks.h"
#include "nn/gpt.h"

namespace minidl::dist::naive {

class Zero3 final : public nn::BlockHooks {
 public:
  Zero3(nn::GPT& model, ProcessGroup& group) : model_(model), group_(group) {
    for (auto [name, p] : model.named_parameters()) group.broadcast(p, 0)->wait();
    for (auto [name, b] : model.named_buffers()) group.broadcast(b, 0)->wait();
    // The hooks stay on the parameters: they reach this object through a weak pointer, dead once it is gone.
    std::weak_ptr<Zero3*> self = self_;
    std::unordered_set<const TensorImpl*> in_blocks;
    for (int64_t i = 0; i < model.config().n_layer; ++i) {
      Block& b = blocks_.emplace_back();
      b.params = model.block_parameters(i);
      int64_t numel = 0;
      for (const Tensor& p : b.params) numel += p.numel();
      const int64_t shard = padded_numel(numel, group.size()) / group.size();
      b.flat = Tensor::zeros({shard * group.size()});
      int64_t offset = 0;
      for (Tensor p : b.params) {  // p: a handle, so set_data re-points the model's own parameter
        Tensor view = b.flat.as_strided(p.shape(), contiguous_strides(p.shape()), offset);
        view.copy_(p.detach());
        p.set_data(view);
        offset += p.numel();
        in_blocks.insert(p.impl());
        p.register_grad_ready_hook([self, i](Tensor&) {
          if (auto z = self.lock()) (*z)->on_block_grad_ready(i);
        });
      }
      b.shard = b.flat.as_strided({shard}, {1}, group.rank() * shard).clone().set_requires_grad(true);
      b.shard.set_grad(Tensor::zeros({shard}));
      release(i);  // from now on the block exists whole only between a gather and a release
    }
    for (auto [name, p] : model.named_parameters()) {
      if (in_blocks.count(p.impl()) || !p.requires_grad()) continue;
      persistent_.push_back(p);
      p.register_grad_ready_hook([self](Tensor& grad) {
        if (auto z = self.lock()) (*z)->group_.all_reduce(grad, ReduceOp::kAvg)->wait();
      });
    }
    model.set_block_hooks(this);
  }
  ~Zero3() override { model_.set_block_hooks(nullptr); }

  // What the optimizer updates: this rank's shard of each block, then the persistent parameters.
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> out;
    for (const Block& b : blocks_) out.push_back(b.shard);
    out.insert(out.end(), persistent_.begin(), persistent_.end());
    return out;
  }

  // Collective. Block i's whole parameters, from every rank's shard (also to read the weights outside a pass).
  void gather(int64_t i) {
    // EXERCISE(zero3): allocate block i's flat buffer again and fill it from every rank's shard.
    Block& b = blocks_[size_t(i)];
    if (b.gathered) return;
    b.flat.impl()->storage->reallocate(size_t(b.flat.numel()) * sizeof(float));
    group_.all_gather(b.flat, b.shard)->wait();
    b.gathered = true;
    // END EXERCISE
  }
  void release(int64_t i) {
    // EXERCISE(zero3): free block i's flat buffer, keeping the object (autograd's saved views alias it).
    blocks_[size_t(i)].flat.impl()->storage->release();
    blocks_[size_t(i)].gathered = false;
    // END EXERCISE
  }

  void before_block(int64_t i, bool) override { gather(i); }
  void after_block(int64_t i, bool recompute) override {
    if (!recompute) release(i);  // a recomputation runs inside the backward, which still needs the block
  }
  void before_block_backward(int64_t i) override {
    blocks_[size_t(i)].grads_left = blocks_[size_t(i)].params.size();
    gather(i);
  }

 private:
  struct Block {
    std::vector<Tensor> params;  // views of flat
    Tensor flat;                 // P_i elements, allocated only while gathered
    Tensor shard;                // P_i / N elements this rank keeps; its .grad() is the averaged gradient shard
    bool gathered = true;
    size_t grads_left = 0;  // parameters whose gradient is not yet final in this backward
  };

  void on_block_grad_ready(int64_t i) {
    // EXERCISE(zero3): once the block's last gradient is ready: reduce-scatter (average) its flat gradient into the
    // shard's gradient, drop the parameters' full gradients, free the block.
    Block& b = blocks_[size_t(i)];
    if (--b.grads_left > 0) return;
    // The block's full gradient, laid out like flat, exists only for this reduce-scatter.
    Tensor flat_grad = Tensor::zeros({b.flat.numel()});
    int64_t offset = 0;
    for (Tensor p : b.params) {
      flat_grad.as_strided({p.numel()}, {1}, offset).copy_(p.grad().reshape({p.numel()}));
      offset += p.numel();
      p.set_grad(Tensor());
    }
    Tensor shard_grad = b.shard.grad();
    group_.reduce_scatter(shard_grad, flat_grad, ReduceOp::kAvg)->wait();
    release(i);
    // END EXERCISE
  }

  nn::GPT& model_;
  ProcessGroup& group_;
  std::vector<Block> blocks_;
  std::vector<Tensor> persistent_;  // wte, wpe, ln_f: whole on every rank
  std::shared_ptr<Zero3*> self_ = std::make_shared<Zero3*>(this);
};

}  // namespace minidl::dist::naive
