// BlockHooks: calls nn::GPT makes around each transformer block, the seam for code that must act per block — e.g.
// gather a block's sharded parameters (GPT::block_parameters) before it runs, free them after, and gather them again
// before its backward (dist/zero3.h).
//
//   struct Gather : nn::BlockHooks {
//     void before_block(int64_t block, bool) override { all_gather(block); }
//     void after_block(int64_t block, bool) override { release(block); }
//     void before_block_backward(int64_t block) override { all_gather(block); }
//   };
//   Gather hooks;
//   model.set_block_hooks(&hooks);   // null: no hooks
//
// Blocks are named by their global index (0 .. n_layer - 1), also on a pipeline stage that holds only some.
//
// Call order for GPT::blocks(a, b, x) (and so forward and loss), then backward from its result:
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

}  // namespace minidl::nn
