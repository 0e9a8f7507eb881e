// OuterSync: local SGD and DiLoCo, data parallelism that talks every H steps instead of every step.
//
//   dist::OuterSync outer(model.parameters(), topology.replica_group(), {.kind = dist::OuterKind::kDiLoCo,
//                                                                         .every = 8});
//   for (int64_t step = 0; step < steps; ++step) {
//     inner_step();                        // any layout inside the replica: DDP, ZeRO 1-2, tp, pp
//     outer.after_step(step + 1);          // every 8th step: the replicas agree on one model again
//   }
//   outer.finish(steps);                   // a last, shorter window is synced too: ceil(steps / H) syncs
//
// The world is R replicas of one layout (dist/topology.h's replica axis). Inside a replica, training runs as it
// always does. Across replicas nothing moves for H steps; then the ranks that hold the same coordinates (the same
// tp slice of the same pipeline stage) combine what they hold:
//
//   local SGD (Stich 2018): every replica's parameters θ_r are averaged,  θ ← (1/R) Σ_r θ_r.
//   DiLoCo (Douillard et al. 2023, arXiv 2311.08105): each replica's pseudo-gradient Δ_r = θ_global − θ_r (what H
//     inner steps moved it, pointing uphill like a gradient) is averaged, Δ = (1/R) Σ_r Δ_r, and an outer SGD
//     with Nesterov momentum (torch.optim.SGD's rule) steps the global parameters:
//       m ← μ·m + Δ;   θ_global ← θ_global − η·(Δ + μ·m) with Nesterov, θ_global − η·m without;
//     then every replica starts the next window from θ_global. With η = 1 and μ = 0 this is local SGD: θ_global −
//     (θ_global − mean θ_r) = mean θ_r. The sign matters (torchft's PR #233 fixed it): local − global would step
//     away from where the replicas went.
//
// At H = 1 with inner SGD both equal DDP: mean_r(θ − lr·g_r) = θ − lr·mean_r(g_r), DDP's update (the rounding
// differs: parameters are averaged instead of gradients).
//
// Communication: one all-reduce of the rank's parameters (f32: 4 bytes a parameter it holds) per H steps, where DDP
// all-reduces as many gradient bytes every step: H times less traffic, and none of it during the H − 1 steps
// between (the replicas can sit on a slow link). A ring moves 2(R−1)/R of those bytes per rank.
//
// Memory: DiLoCo keeps θ_global and m beside the model, in host memory (2 × 4 bytes a parameter, as torchft keeps
// them on the CPU), and in checkpoints (train/checkpoint.h), so a run resumes inside a window; local SGD keeps
// nothing. The pseudo-gradients pass through one host buffer of the same size.
//
// The outer step runs in f32 on the host, element by element, in a fixed order: the result depends only on the
// replicas' parameters and the sum of R values (exact in either order at R = 2), so a one-process simulation of the
// replicas (dist/naive/local_sgd.h) is bitwise equal to the distributed run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/comm_hook.h"
#include "dist/process_group.h"

namespace minidl::dist {

enum class OuterKind { kLocalSgd, kDiLoCo };

// "local-sgd" or "diloco"; throws naming the accepted ones otherwise.
OuterKind outer_kind(const std::string& name);
const char* outer_kind_name(OuterKind kind);

struct OuterOptions {
  OuterKind kind = OuterKind::kDiLoCo;
  int64_t every = 1;      // H: inner steps per window (>= 1)
  double lr = 0.7;        // η, DiLoCo's outer learning rate (torchft's example)
  double momentum = 0.9;  // μ
  bool nesterov = true;
  // What the pseudo-gradients' average sends (dist/comm_hook.h): DiLoCo only (local SGD averages the parameters
  // themselves, which 16 bits would round by 2^-9 of their size at every sync).
  Compression compression = Compression::kNone;
};

struct OuterStats {
  int64_t syncs = 0;   // outer all-reduces so far
  uint64_t bytes = 0;  // their payload (4 bytes a parameter each, 2 with a 16-bit hook)
  double ms = 0;       // their time, the outer step included
};

class OuterSync {
 public:
  // `params`: the f32 tensors this rank holds and trains (any device). `replicas`: the group of the ranks at this
  // rank's coordinates in every replica (a host group: the buffers are on the host). Collective over `replicas`:
  // every replica starts from replica 0's parameters (broadcast), so θ_global is the same everywhere.
  OuterSync(std::vector<Tensor> params, ProcessGroup& replicas, OuterOptions options);
  // Resuming a window where a checkpoint stopped it: each replica keeps its own parameters (they differ in the
  // middle of a window) and DiLoCo takes back θ_global and m (flat over `params`; empty for local SGD). Local.
  OuterSync(std::vector<Tensor> params, ProcessGroup& replicas, OuterOptions options, std::vector<float> global,
            std::vector<float> momentum);

  const OuterOptions& options() const { return options_; }
  // After `steps_done` inner steps: at the end of a window (steps_done a multiple of H), the outer step.
  // Collective over the replicas then. Returns whether it synced.
  bool after_step(int64_t steps_done);
  // At the end of the run: a window cut short by the last step is synced as well, so every replica ends with the
  // same parameters. Returns whether it synced.
  bool finish(int64_t steps_done);
  const OuterStats& stats() const { return stats_; }

  // DiLoCo's state, flat over `params` in their order (empty for local SGD): for checkpoints and tests.
  const std::vector<float>& global() const { return global_; }
  const std::vector<float>& momentum() const { return momentum_; }

 private:
  void check_params();  // and counts them
  void sync();
  std::vector<float> read_params() const;  // the parameters, flat, on the host
  void write_params(const std::vector<float>& flat);

  std::vector<Tensor> params_;
  ProcessGroup& replicas_;
  OuterOptions options_;
  int64_t numel_ = 0;
  std::vector<float> global_, momentum_;
  OuterStats stats_;
};

}  // namespace minidl::dist
