// Naive pipeline parallelism, second schedule: 1F1B ("one forward, one backward") over S stages, rank s of the group
// running stage s. Read after naive/gpipe.h: the same messages and the same bubble, in another order that keeps
// far fewer micro-batches alive. The schedule is picotron's train_step_pipeline_1f1b; production: dist/pipeline.cpp
// (make_schedule's per-rank action lists), train/step.cpp (the executor).
//
//   nn::GPT part(cfg, seed, {starts[s], starts[s + 1], s == 0, s == S - 1});    // only stage s's blocks
//   double loss = dist::naive::one_f_one_b_step(group, M, {B / M, T, C}, [&](const Tensor& h, int m) {
//     Tensor out = part.blocks(starts[s], starts[s + 1], s == 0 ? part.embed(ids[m]) : h);
//     return s < S - 1 ? out : mul(part.head_loss(out, targets[m], Reduction::kSum), 1.0 / (B * T));
//   });
//   if (s == 0 || s == S - 1)   // the tied wte, on the first and the last stage: naive/gpipe.h
//     dist::naive::sum_shared_gradients(first_and_last_group, {part.wte->weight});
//   optimizer.step();   // over part.parameters()
//
// The schedule. Stage s runs, in order:
//   warm-up:      w = min(S - 1 - s, M) forwards, F0 .. F(w-1);
//   steady state: for m = w .. M-1, the forward of m, then the backward of m - w (the oldest one in flight);
//   cool-down:    the backwards of the last w micro-batches.
// Why w = S - 1 - s: after its forward on stage s, a micro-batch comes back as a gradient 2(S - 1 - s) slots later
// (a forward and a backward on each later stage), and in the steady state stage s starts one micro-batch every 2
// slots (one forward, one backward): so S - s micro-batches are in flight below stage s at a time, w of them
// forwarded before its first backward (Little's law). Fewer would starve the later stages; more only hold memory.
// The last stage (w = 0) runs each backward right after its forward. With S = 2, M = 4, one slot per pass:
//   slot:    1   2   3   4   5   6   7   8   9   10
//   rank 0:  F0  F1  .   B0  F2  B1  F3  B2  .   B3
//   rank 1:  .   F0  B0  F1  B1  F2  B2  F3  B3  .
//
// Messages: GPipe's, micro-batch by micro-batch. Across each of the S - 1 cuts, one activation forward and one
// gradient back, (B/M)·T·C elements each, so 2(S - 1) messages per micro-batch; only their order changes.
// Bubble: the same as GPipe's. The last stage starts S - 1 slots late (micro-batch 0 has to reach it), and stage 0
// ends S - 1 slots after it (the last gradient has to come back): the step takes 2(M + S - 1) slots, of which each
// stage is busy 2M, so (S - 1)/(M + S - 1) is idle; only more micro-batches shrink it (interleaved 1F1B, in
// production, divides it by the virtual stages).
// Memory, the reason for 1F1B: stage s holds at most w + 1 = S - s micro-batches between forward and backward
// (stage 0: S), where GPipe holds all M. With M >> S, the activations of M/S times fewer micro-batches.
//
// Sends are posted and waited for at the end of the step; receives block. A send that blocked until its receive
// was posted would deadlock the steady state above: after slot 2 rank 0 sends F1's activation, which rank 1
// receives only after sending B0's gradient, which rank 0 receives only after that send. Receives block in schedule
// order and each message they wait for is sent in an earlier slot, so no cycle of waits can form.
//
// Why it equals GPipe and production bitwise: each stage runs the same forwards and the backward of micro-batch
// 0, 1, ..., M - 1 in that order (the oldest in flight first), so each parameter adds the same gradient pieces in
// the same order. Only when each backward runs changes, never what it computes.
//
// What production adds: S stages with V virtual stages each (interleaved 1F1B), schedules as data validated before
// the first step and simulated for their bubble, receives posted ahead of their use, data parallelism's gradient
// sync armed for the last backward only, recomputation.
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "dist/process_group.h"

namespace minidl::dist::naive {

// One training step's forward and backward over M micro-batches, rank s of `group` running stage s of S.
// stage_forward(h, m): micro-batch m through this stage. h is the activation received from stage s - 1, of shape
// activation_shape (undefined on stage 0, which reads the ids itself); returns the activation for stage s + 1, or on
// the last stage micro-batch m's share of the batch's loss (the M shares add up to the batch's mean loss).
// Returns on the last stage the batch's loss (the shares summed in f32, as production sums them), elsewhere zero.
// Gradients are added into the parameters' .grad(), as any backward does.
inline double one_f_one_b_step(ProcessGroup& group, int micro_batches, const Shape& activation_shape,
                               const std::function<Tensor(const Tensor&, int)>& stage_forward) {
  MINIDL_CHECK(micro_batches >= 1, "naive 1F1B: expected at least 1 micro-batch, got ", micro_batches);
  const int S = group.size(), s = group.rank(), M = micro_batches;
  const bool first = s == 0, last = s == S - 1;
  // Tags: activation of micro-batch m = m, its gradient = M + m, so each message meets its own receive.
  std::deque<std::pair<Tensor, Tensor>> in_flight;  // (received input, output) of each forward not yet backwarded
  std::vector<std::shared_ptr<Work>> sends;         // a Work keeps its tensor alive until it completes
  float loss = 0;
  // EXERCISE(pipeline): forward(m): receive from s - 1 (not on stage 0), run, send to s + 1 (on the last stage, add to
  // the loss); backward(m): the oldest in flight, its gradient received from s + 1 (not on the last stage), sent to
  // s - 1. Warm-up, steady state and cool-down as derived above; wait for every send before returning.
  auto forward = [&](int m) {
    Tensor h;
    if (!first) {
      h = Tensor::empty(activation_shape);
      group.recv(h, s - 1, m)->wait();
      h.set_requires_grad(true);  // a leaf: backward stops here and leaves dL/dh in h.grad()
    }
    Tensor out = stage_forward(h, m);
    if (last)
      loss += float(out.item());
    else
      sends.push_back(group.send(out.detach(), s + 1, m));
    in_flight.emplace_back(h, out);
  };
  auto backward = [&](int m) {
    auto [h, out] = in_flight.front();  // the oldest micro-batch in flight is m: backwards run in order
    in_flight.pop_front();
    if (last) {
      out.backward();
    } else {
      Tensor grad = Tensor::empty(activation_shape);
      group.recv(grad, s + 1, M + m)->wait();
      out.backward(grad);  // the rest of micro-batch m's backward on this stage
    }
    if (!first) sends.push_back(group.send(h.grad(), s - 1, M + m));
  };
  const int warmup = std::min(S - 1 - s, M);
  for (int m = 0; m < warmup; ++m) forward(m);
  for (int m = warmup; m < M; ++m) {
    forward(m);
    backward(m - warmup);
  }
  for (int m = M - warmup; m < M; ++m) backward(m);
  for (auto& work : sends) work->wait();
  // END EXERCISE
  return loss;
}

}  // namespace minidl::dist::naive
