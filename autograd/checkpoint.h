// Activation checkpointing: trade compute for memory by keeping only a region's inputs during forward and
// re-running the region during backward.
//
//   // x: (B, T, C). Only x is kept for backward; block's activations are rebuilt when the gradient arrives.
//   Tensor y = autograd::checkpoint([&](const Tensor& in) { return block->forward(in); }, x, block->parameters());
//
// Forward runs fn under NoGradGuard (no node is recorded, no activation saved) and records one node over the
// inputs and `params`. Its backward:
//   1. restores the forward's autocast state (autograd/autocast.h) and turns recording on;
//   2. re-runs fn on detached copies of the inputs (requiring grad as the originals do);
//   3. runs autograd::grad() from the recomputed outputs with the incoming gradients, capturing the gradients
//      that arrive at the input copies and at `params` (nothing is accumulated into .grad() there);
//   4. returns them to the outer backward as this node's input gradients.
//
// Why parameters go through the outer backward (step 3 captures them instead of letting the inner backward
// accumulate into .grad()): a parameter's AccumulateGrad then runs once per outer backward, after every
// contribution to it has been summed by the engine — so its gradient-ready hooks (DDP's bucket all-reduce) fire
// exactly once, with the final gradient, as without checkpointing. List every parameter fn uses in `params`. A
// parameter fn uses that is not listed still gets its gradient (the inner backward accumulates it directly), but
// its hooks fire from inside the recomputation, once per checkpointed region it appears in.
//
// Randomness: fn must compute the same function when re-run. minidl's dropout masks are a pure function of
// (seed, stream, DropoutContext::step) — there is no hidden generator state to save — so the recomputation draws the
// same masks as long as the context's step is the same; nn::GPT pins the step its forward ran with inside fn
// (nn/gpt.cpp), so even a step advanced between forward and backward cannot change them. Anything else fn reads
// (module train/eval mode, weights) must not change between forward and backward.
//
// The node holds the inputs (their storage, not their history) until its backward runs; a second backward through
// it is an error. Outputs that are not floating point get no gradient. Gradients are bitwise identical to running
// fn without checkpointing when fn's ops are deterministic (all of minidl's CPU kernels are).
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace minidl::autograd {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn(inputs) as a checkpointed region (see above) and returns its outputs. fn is kept (copied) until
// backward: whatever it captures must stay valid until then.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params = {});

// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const std::vector<Tensor>& params = {});

}  // namespace minidl::autograd
