// Naive pipeline parallelism: GPipe over S stages, rank s of the group running stage s on M micro-batches: all M
// forwards, then all M backwards. A schedule is data, as in production: a list of actions per rank (receive, compute,
// send) that dist::validate_schedule checks and dist::simulate times, run by a small executor. Read after
// naive/ddp.h, before naive/one_f_one_b.h (another list, the same executor); production: dist/pipeline.h
// (make_schedule), train/stage.h and train/step.cpp (the executor).
//
//   nn::GPT part(cfg, seed, {starts[s], starts[s + 1], s == 0, s == S - 1});    // only stage s's blocks
//   double loss = dist::naive::gpipe_step(group, M, {B / M, T, C}, [&](const Tensor& h, int m) {
//     Tensor out = part.blocks(starts[s], starts[s + 1], s == 0 ? part.embed(ids[m]) : h);
//     return s < S - 1 ? out : mul(part.head_loss(out, targets[m], Reduction::kSum), 1.0 / (B * T));
//   });
//   if (s == 0 || s == S - 1)   // the tied wte lives on the first and the last stage
//     dist::naive::sum_shared_gradients(first_and_last_group, {part.wte->weight});
//   optimizer.step();   // over part.parameters(): each rank steps its own part
//
// Each rank builds only its part (as train::Stage does), each parameter initialised from its index in the whole
// model (nn/gpt.h): the parts are the whole model's, cut in S.
//
// Messages. Forward: stage s sends micro-batch m's activation at its cut (B/M, T, C) to s + 1, which receives it
// into a fresh leaf tensor that requires grad and continues the forward. Backward: the backward of micro-batch m on
// stage s + 1 ends at that leaf, whose .grad() is dL/d(activation); it is sent back, and stage s continues its
// backward with it: output.backward(grad). Autograd never crosses the wire, only these two tensors do. Per
// micro-batch and cut: one activation forward, one gradient back, (B/M)·T·C elements each, 2(S - 1) messages.
//
// Why it equals one process accumulating the same M micro-batches: the stages together run exactly its forward and
// backward of each micro-batch (what crosses a cut is the value one process computes there), and each parameter
// adds its M gradient pieces in micro-batch order, as a one-process loop does. The tied wte's embedding and head
// pieces are summed per stage, then added: another order, and production's (train/step.h), which it equals bitwise.
//
// Schedule and its cost, S = 2 stages, here M = 4, one time slot per forward or backward:
//   slot:    1   2   3   4   5   6   7   8   9   10
//   rank 0:  F0  F1  F2  F3  .   .   B0  B1  B2  B3
//   rank 1:  .   F0  F1  F2  F3  B0  B1  B2  B3  .
// The idle slots are the "bubble": 2(S-1) of 2(M+S-1) slots, a fraction (S-1)/(M+S-1) (dist::simulate measures it
// on the lists). Memory: all M micro-batches' activations stay alive from their forward to their backward: GPipe's
// price. 1F1B (naive/one_f_one_b.h) keeps at most S in flight, with the same bubble. Production adds virtual stages
// (interleaved 1F1B), receives posted ahead of their use, recomputation.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "dist/pipeline.h"
#include "dist/process_group.h"

namespace minidl::dist::naive {

// Micro-batch m's forward (forward = true) or backward on stage s of S: its receive, its compute, its send.
inline std::vector<Action> pass(int S, int s, int m, bool forward) {
  std::vector<Action> out;
  // EXERCISE(pipeline): forward: receive the activation from s - 1 (not on stage 0), forward, send the output to s + 1
  // (not on the last stage); backward: receive the output's gradient from s + 1 (not on the last), backward, send
  // the input's gradient to s - 1 (not on stage 0). An action is {kind, micro, chunk (0 here), peer}.
  const bool first = s == 0, last = s == S - 1;
  if (forward) {
    if (!first) out.push_back({ActionKind::kRecvActivation, m, 0, s - 1});
    out.push_back({ActionKind::kForward, m});
    if (!last) out.push_back({ActionKind::kSendActivation, m, 0, s + 1});
  } else {
    if (!last) out.push_back({ActionKind::kRecvGrad, m, 0, s + 1});
    out.push_back({ActionKind::kBackward, m});
    if (!first) out.push_back({ActionKind::kSendGrad, m, 0, s - 1});
  }
  // END EXERCISE
  return out;
}

// Stage s's GPipe list: every forward, then every backward, then the optimizer step.
inline std::vector<Action> gpipe_actions(int S, int s, int M) {
  std::vector<Action> out;
  auto add = [&](const std::vector<Action>& actions) { out.insert(out.end(), actions.begin(), actions.end()); };
  // EXERCISE(pipeline): the M forwards in micro-batch order, then the M backwards in the same order, then one
  // kOptimizerStep.
  for (int m = 0; m < M; ++m) add(pass(S, s, m, true));
  for (int m = 0; m < M; ++m) add(pass(S, s, m, false));
  out.push_back({ActionKind::kOptimizerStep});
  // END EXERCISE
  return out;
}

// Runs this rank's list over M micro-batches, rank s of `group` running stage s. stage_forward(h, m): micro-batch m
// through this stage from h, received from s - 1 with shape activation_shape (undefined on stage 0, which reads the
// ids itself); returns the activation for s + 1, or on the last stage m's share of the batch's mean loss. Returns
// there the M shares summed in f32 (as production sums them), elsewhere zero. Gradients add into .grad(); the
// caller steps its optimizer after. Receives block, so a list receives right before the compute that needs it;
// sends are waited for at the optimizer step (a blocking send could deadlock 1F1B: naive/one_f_one_b.h says how).
inline double run_actions(ProcessGroup& group, const std::vector<Action>& actions, int micro_batches,
                          const Shape& activation_shape,
                          const std::function<Tensor(const Tensor&, int)>& stage_forward) {
  const int M = micro_batches;
  const bool last = group.rank() == group.size() - 1;
  std::vector<Tensor> input(M), output(M), grad(M);  // micro-batch m's, while in flight
  std::vector<std::shared_ptr<Work>> sends;          // a Work keeps its tensor alive
  float loss = 0;
  for (const Action& a : actions) {
    const size_t m = size_t(a.micro);
    // EXERCISE(pipeline): one case per ActionKind; tags: m for micro-batch m's activation, M + m for its gradient. A
    // received activation is a leaf that requires grad; a backward starts from the loss share or the received grad.
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        input[m] = Tensor::empty(activation_shape);
        group.recv(input[m], a.peer, a.micro)->wait();
        input[m].set_requires_grad(true);  // a leaf: backward stops here and leaves dL/dh in its .grad()
        break;
      case ActionKind::kForward:
        output[m] = stage_forward(input[m], a.micro);
        if (last) loss += float(output[m].item());
        break;
      case ActionKind::kSendActivation: sends.push_back(group.send(output[m].detach(), a.peer, a.micro)); break;
      case ActionKind::kRecvGrad:
        grad[m] = Tensor::empty(activation_shape);
        group.recv(grad[m], a.peer, M + a.micro)->wait();
        break;
      case ActionKind::kBackward:
        if (last)
          output[m].backward();
        else
          output[m].backward(grad[m]);   // the rest of micro-batch m's backward on this stage
        output[m] = grad[m] = Tensor();  // its graph is freed: it is no longer in flight
        break;
      case ActionKind::kSendGrad:  // the Work keeps the gradient alive; the slot lets the input go
        sends.push_back(group.send(std::exchange(input[m], Tensor()).grad(), a.peer, M + a.micro));
        break;
      case ActionKind::kOptimizerStep:
        for (auto& work : sends) work->wait();
    }
    // END EXERCISE
  }
  return loss;
}

// One GPipe step over `group`'s S stages: this rank's gpipe_actions, run.
inline double gpipe_step(ProcessGroup& group, int M, const Shape& activation_shape,
                         const std::function<Tensor(const Tensor&, int)>& stage_forward) {
  return run_actions(group, gpipe_actions(group.size(), group.rank(), M), M, activation_shape, stage_forward);
}

// A parameter used on two stages (the tied wte: embedding on the first, head on the last) has part of its gradient
// on each: sum them, so both copies take the same step and stay equal. `group`: the ranks that hold it.
inline void sum_shared_gradients(ProcessGroup& group, const std::vector<Tensor>& shared) {
  for (const Tensor& t : shared) {
    // EXERCISE(pipeline): sum each shared parameter's gradient over the group, in place.
    Tensor grad = t.grad();
    group.all_reduce(grad, ReduceOp::kSum)->wait();
    // END EXERCISE
  }
}

}  // namespace minidl::dist::naive
