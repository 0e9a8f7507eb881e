// Naive pipeline parallelism, second schedule: 1F1B ("one forward, one backward") over S stages, rank s of the group
// running stage s. Read after naive/gpipe.h: the same messages, the same bubble and the same executor (run_actions),
// only another action list, in an order that keeps far fewer micro-batches alive. The schedule is picotron's
// train_step_pipeline_1f1b; production: dist/pipeline.cpp (make_schedule's lists), train/step.cpp (the executor).
//
//   double loss = dist::naive::one_f_one_b_step(group, M, {B / M, T, C}, stage_forward);   // as naive/gpipe.h's
//   dist::validate_schedule({{dist::ScheduleKind::k1F1B, S, M}, lists});   // lists[r] = one_f_one_b_actions(S, r, M)
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
// Sends are posted and waited for at the optimizer step; receives block. A send that blocked until its receive
// was posted would deadlock the steady state above: after slot 2 rank 0 sends F1's activation, which rank 1
// receives only after sending B0's gradient, which rank 0 receives only after that send. Receives block in schedule
// order and each message they wait for is sent in an earlier slot, so no cycle of waits can form.
//
// Why it equals GPipe and production bitwise: each stage runs the same forwards and the backward of micro-batch
// 0, 1, ..., M - 1 in that order (the oldest in flight first), so each parameter adds the same gradient pieces in
// the same order. Only when each backward runs changes, never what it computes.
//
// What production adds: V virtual stages per rank (interleaved 1F1B), receives posted ahead of their use, data
// parallelism's gradient sync armed for the last backward only, recomputation.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "gpipe.h"  // beside this file: in an exercise folder, the learner's own

namespace minidl::dist::naive {

// Stage s's 1F1B list: warm-up, steady state and cool-down as derived above, then the optimizer step.
inline std::vector<Action> one_f_one_b_actions(int S, int s, int M) {
  std::vector<Action> out;
  auto add = [&](const std::vector<Action>& actions) { out.insert(out.end(), actions.begin(), actions.end()); };
  // EXERCISE(pipeline): w = min(S - 1 - s, M) forwards; then for m = w .. M-1 the forward of m and the backward of
  // m - w (the oldest in flight); then the last w backwards; then one kOptimizerStep. pass() gives each one's actions.
  const int warmup = std::min(S - 1 - s, M);
  for (int m = 0; m < warmup; ++m) add(pass(S, s, m, true));
  for (int m = warmup; m < M; ++m) {
    add(pass(S, s, m, true));
    add(pass(S, s, m - warmup, false));
  }
  for (int m = M - warmup; m < M; ++m) add(pass(S, s, m, false));
  out.push_back({ActionKind::kOptimizerStep});
  // END EXERCISE
  return out;
}

// One 1F1B step over `group`'s S stages: this rank's one_f_one_b_actions, run by naive/gpipe.h's executor.
inline double one_f_one_b_step(ProcessGroup& group, int M, const Shape& activation_shape,
                               const std::function<Tensor(const Tensor&, int)>& stage_forward) {
  MINIDL_CHECK(M >= 1, "naive 1F1B: expected at least 1 micro-batch, got ", M);
  return run_actions(group, one_f_one_b_actions(group.size(), group.rank(), M), M, activation_shape, stage_forward);
}

}  // namespace minidl::dist::naive
