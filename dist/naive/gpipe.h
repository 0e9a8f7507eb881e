// Naive pipeline parallelism: a two-stage GPipe. The model is cut in two; rank 0 runs the first half, rank 1 the
// second, on M micro-batches: all M forwards, then all M backwards. Read after naive/ddp.h, before
// naive/one_f_one_b.h; production: dist/pipeline.h (schedules as data), train/stage.h and train/step.cpp.
//
//   nn::GPT half(cfg, seed, rank == 0 ? nn::GPTStage{0, L / 2, true, false} : nn::GPTStage{L / 2, L, false, true});
//   double loss = dist::naive::gpipe_step(group, M, {B / M, T, C},
//       [&](int m) { return half.blocks(0, L / 2, half.embed(ids[m])); },                             // rank 0
//       [&](const Tensor& h, int m) {                                                                 // rank 1
//         return mul(half.head_loss(half.blocks(L / 2, L, h), targets[m], Reduction::kSum), 1.0 / (B * T));
//       });
//   dist::naive::sum_shared_gradients(group, {half.wte->weight});   // the tied embedding lives on both stages
//   optimizer.step();   // over half.parameters(): each rank steps its own half
//
// Each rank builds only its half, as production's train::Stage does: rank 0 the embedding and blocks [0, L/2),
// rank 1 blocks [L/2, L), ln_f and the head (wte again: tied). Each parameter is initialised from its index in the
// whole model (nn/gpt.h), so the halves are the whole model's, cut in two, and each rank holds about half the weights.
//
// Messages. Forward: rank 0 sends micro-batch m's activation at the cut (B/M, T, C) to rank 1, which receives it
// into a fresh leaf tensor that requires grad and continues the forward to the loss. Backward: rank 1's backward
// of micro-batch m ends at that leaf, whose .grad() is dL/d(activation); it is sent back, and rank 0 continues
// the backward with it: activation.backward(grad). Autograd never crosses the wire, only these two tensors do.
// Per micro-batch: one activation forward, one gradient backward, (B/M)·T·C elements each.
//
// Why it equals one process with gradient accumulation over the same M micro-batches: each micro-batch's loss
// is its share of the batch's mean, the stages together run exactly the one-process forward and backward of each
// micro-batch (the received activation and gradient are the values one process computes at the cut), and each
// parameter accumulates its M gradient pieces in micro-batch order, the order a one-process loop adds them. The
// tied wte is the exception: its embedding and head pieces are summed per stage, then added (another order). It
// equals production's executor (train/step.h) bit for bit, wte included: that adds the same two sums.
//
// Schedule and its cost, S = 2 stages, here M = 4, one time slot per forward or backward:
//   slot:    1   2   3   4   5   6   7   8   9   10
//   rank 0:  F0  F1  F2  F3  .   .   B0  B1  B2  B3
//   rank 1:  .   F0  F1  F2  F3  B0  B1  B2  B3  .
// The idle slots are the "bubble": 2(S-1) of 2(M+S-1) slots, a fraction (S-1)/(M+S-1), so more micro-batches
// shrink it. Memory: all M micro-batches' activations stay alive from their forward to their backward: GPipe's
// price. 1F1B (naive/one_f_one_b.h) starts each backward as early as possible, keeping at most S micro-batches in
// flight, with the same bubble.
//
// What production adds: any number of stages and virtual stages, 1F1B and interleaved 1F1B, schedules validated
// before the first step (matching sends and receives) and simulated for their bubble, asynchronous sends,
// data parallelism and ZeRO across pipelines, activation recomputation.
#pragma once

#include <functional>
#include <vector>

#include "autograd/functions.h"
#include "dist/process_group.h"

namespace minidl::dist::naive {

// One training step's forward and backward over M micro-batches, on a group of two ranks.
// first_stage(m), on rank 0: micro-batch m's activation at the cut, of shape activation_shape.
// last_stage(h, m), on rank 1: micro-batch m's share of the batch's loss (the M shares add up to the batch's mean
// loss) from the received activation h.
// Returns on rank 1 the batch's loss (the shares summed in f32, as production sums them), on rank 0 zero.
// Gradients are added into the parameters' .grad(), as any backward does.
inline double gpipe_step(ProcessGroup& group, int micro_batches, const Shape& activation_shape,
                         const std::function<Tensor(int)>& first_stage,
                         const std::function<Tensor(const Tensor&, int)>& last_stage) {
  MINIDL_CHECK(group.size() == 2, "naive GPipe: expected a group of 2 ranks (one per stage), got ", group.size());
  const int M = micro_batches;
  // Tags: activation of micro-batch m = m, its gradient = M + m, so each message meets its own receive.
  // EXERCISE(pipeline): rank 0: all M forwards, sending each activation (tag m), then all M backwards from the received
  // gradients (tag M + m). Rank 1: receive each activation into a leaf that requires grad, run last_stage, then the
  // M backwards, sending each leaf's gradient back. Return rank 1's loss summed in f32, rank 0's 0.
  if (group.rank() == 0) {
    std::vector<Tensor> activations;  // kept, with their graphs, until their backward
    for (int m = 0; m < M; ++m) {
      activations.push_back(first_stage(m));
      group.send(activations.back().detach(), 1, m)->wait();
    }
    for (int m = 0; m < M; ++m) {
      Tensor grad = Tensor::empty(activation_shape);
      group.recv(grad, 1, M + m)->wait();
      activations[size_t(m)].backward(grad);  // the rest of micro-batch m's backward, down to the embedding
    }
    return 0.0;
  }
  std::vector<Tensor> inputs, losses;
  for (int m = 0; m < M; ++m) {
    Tensor h = Tensor::empty(activation_shape);
    group.recv(h, 0, m)->wait();
    h.set_requires_grad(true);  // a leaf: backward stops here and leaves dL/dh in h.grad()
    inputs.push_back(h);
    losses.push_back(last_stage(h, m));
  }
  float loss = 0;
  for (int m = 0; m < M; ++m) {
    losses[size_t(m)].backward();
    loss += float(losses[size_t(m)].item());
    group.send(inputs[size_t(m)].grad(), 0, M + m)->wait();
  }
  return loss;
  // END EXERCISE
}

// A parameter used on both stages (GPT's tied wte: the embedding on rank 0, the head on rank 1) has part of its
// gradient on each rank: sum them, so that both copies take the same step and stay equal. `group`: the ranks that
// hold it (here both; with S stages the first and the last).
inline void sum_shared_gradients(ProcessGroup& group, const std::vector<Tensor>& shared) {
  for (const Tensor& t : shared) {
    // EXERCISE(pipeline): sum each shared parameter's gradient over the group, in place.
    Tensor grad = t.grad();
    group.all_reduce(grad, ReduceOp::kSum)->wait();
    // END EXERCISE
  }
}

}  // namespace minidl::dist::naive
