// BlockHooks: calls a BlockModule (nn::GPT, or a user's module) makes around each of its blocks, the seam for code
// that must act per block — e.g. gather a block's sharded parameters (block_parameters) before it runs, free them
// after, and gather them again before its backward (dist/zero3.h).
//
//   struct Gather : nn::BlockHooks {
//     void before_block(int64_t block, bool) override { all_gather(block); }
//     void after_block(int64_t block, bool) override { release(block); }
//     void before_block_backward(int64_t block) override { all_gather(block); }
//   };
//   Gather hooks;
//   model.set_block_hooks(&hooks);   // null: no hooks
//
// A module of one's own becomes a BlockModule by naming its blocks and running each through run_block:
//
//   struct Mlp : nn::BlockModule {
//     std::vector<std::shared_ptr<nn::Linear>> layers;          // block i: layer i
//     int64_t num_blocks() const override { return int64_t(layers.size()); }
//     std::vector<Tensor> block_parameters(int64_t i) const override { return layers[size_t(i)]->parameters(); }
//     Tensor forward(Tensor x) const {
//       for (size_t i = 0; i < layers.size(); ++i)
//         x = run_block(int64_t(i), x, [&](const Tensor& in) { return autograd::gelu(layers[i]->forward(in)); });
//       return x;
//     }
//   };
//
// Blocks are named by their global index (first_block() .. first_block() + num_blocks() - 1), also on a pipeline
// stage of a GPT that holds only some.
//
// Call order for GPT::blocks(a, b, x) (and so forward and loss; run_block is the same for one block), then backward
// from its result:
//   forward, for i = a .. b-1:   before_block(i, false), block i's forward, after_block(i, false)
//   backward, for i = b-1 .. a:  before_block_backward(i), then block i's backward. Under a recompute setting
//     (GPT::set_recompute) the checkpointed part is re-run inside that backward, wrapped in
//     before_block(i, true) ... after_block(i, true):
//       none:   before_block_backward(i)
//       block:  before_block_backward(i), before_block(i, true), after_block(i, true)   (then the block's backward)
//       attn:   before_block_backward(i), [backward of the MLP half], before_block(i, true), after_block(i, true)
//       mlp:    before_block_backward(i), before_block(i, true), after_block(i, true)   (the MLP half comes last in
//               the block, so its recomputation is the first thing its backward does)
// before_block_backward(i) fires once every gradient of block i's output has arrived — after all of block i+1's
// backward — and before any of block i's parameters receives its gradient. It comes from an identity node recorded
// on the block's output, so it fires only when the forward recorded a graph (grad mode on, something requiring grad)
// and a hooks object was set.
//
// The hooks in effect when a forward runs are the ones its backward (and recomputation) calls: the object must
// outlive that backward.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/module.h"

namespace minidl::nn {

struct BlockHooks {
  virtual ~BlockHooks() = default;
  // Before a block's forward; recompute: this is the re-run of a checkpointed part inside backward.
  virtual void before_block(int64_t /*block*/, bool /*recompute*/) {}
  // After a block's forward (or its re-run).
  virtual void after_block(int64_t /*block*/, bool /*recompute*/) {}
  // Before the block's backward (and before the recomputation, if any).
  virtual void before_block_backward(int64_t /*block*/) {}
};

// A module made of blocks that a per-block scheme may shard: it says which blocks it holds and which parameters
// make each, and calls the hooks around each block (run_block does it all for one block).
class BlockModule : public Module {
 public:
  // The blocks held: global indices [first_block(), first_block() + num_blocks()).
  virtual int64_t first_block() const { return 0; }
  virtual int64_t num_blocks() const = 0;
  // Block i's parameters (i global): the unit a sharding scheme gathers and frees around the block's hooks.
  // Parameters outside every block stay whole on every rank (ZeRO-3's persistent parameters).
  virtual std::vector<Tensor> block_parameters(int64_t i) const = 0;

  // Called around every block; null: none. Not owned: it must outlive every backward of a forward it saw.
  void set_block_hooks(BlockHooks* hooks) { hooks_ = hooks; }
  BlockHooks* block_hooks() const { return hooks_; }

 protected:
  // forward(x) as block i: before_block(i), forward, after_block(i), and on the result (when it records a graph)
  // an identity node whose backward calls before_block_backward(i) before anything of the block's own backward.
  // While tracing (core/trace.h), the forward and the backward are spans "block i forward" / "block i backward".
  Tensor run_block(int64_t i, const Tensor& x, const std::function<Tensor(const Tensor&)>& forward) const;

 private:
  BlockHooks* hooks_ = nullptr;
};

}  // namespace minidl::nn
