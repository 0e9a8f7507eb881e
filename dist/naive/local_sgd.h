// Naive local SGD and DiLoCo: data parallelism that talks once every H steps. Read dist/naive/ddp.h first, then
// this, then dist/local_sgd.h.
//
//   dist::naive::LocalSgd outer(model, group, {.diloco = true, .every = 8});  // every rank: rank 0's weights
//   for (int step = 1; step <= steps; ++step) {
//     model.loss(x_slice, y_slice).backward();   // each rank: its own data, no gradient all-reduce
//     optimizer.step(); optimizer.zero_grad();   // each rank: its own step, so the ranks drift apart
//     outer.after_step(step);                    // every H-th step: one model again
//   }
//
// Local SGD. Each of R workers takes H optimizer steps on its own data, then the parameters are averaged:
//   θ ← (1/R) Σ_r θ_r.
// At H = 1 with SGD this is DDP: (1/R) Σ_r (θ − lr·g_r) = θ − lr·(1/R) Σ_r g_r. At H > 1 the workers' models drift
// apart between averages; the average still descends while the drift is small (a few hundred steps for a
// language model, as DiLoCo found).
//
// DiLoCo (arXiv 2311.08105) treats what a window did as a gradient for a second, outer optimizer. Every worker
// remembers θ_global, the parameters at the window's start, and after H steps sends its pseudo-gradient
//   Δ_r = θ_global − θ_r          (where the window went, with a gradient's sign: pointing uphill),
// averaged into Δ = (1/R) Σ_r Δ_r; the outer SGD with Nesterov momentum (lr η, momentum μ) then steps θ_global:
//   m ← μ·m + Δ,   θ_global ← θ_global − η·(Δ + μ·m),
// and every worker starts the next window from θ_global. η = 1, μ = 0 gives θ_global − Δ = (1/R) Σ_r θ_r: local
// SGD. The sign is the classic bug (torchft's PR #233): with θ_r − θ_global the outer step climbs.
//
// Communication: one all-reduce of every parameter per window, 2(R−1)/R·Ψ elements per worker on a ring, where
// DDP sends as much every step: H times less. Memory: DiLoCo holds θ_global and m, two more copies of the
// parameters (production keeps them in host memory); local SGD nothing extra.
//
// What production (dist/local_sgd.h) adds: one flat host buffer and one all-reduce for all parameters instead of
// one per parameter; any layout inside a replica (the replica group pairs the ranks holding the same slice);
// the last, short window synced at the end; traffic counters; the state in checkpoints.
#pragma once

#include <vector>

#include "dist/process_group.h"
#include "nn/module.h"

namespace minidl::dist::naive {

struct LocalSgdOptions {
  bool diloco = false;  // false: average the parameters (local SGD); true: DiLoCo's outer Nesterov step
  int every = 1;        // H
  float lr = 0.7f, momentum = 0.9f;
};

class LocalSgd {
 public:
  // Collective: every rank starts from rank 0's parameters; DiLoCo remembers them as θ_global, with m = 0.
  LocalSgd(nn::Module& model, ProcessGroup& group, LocalSgdOptions options)
      : model_(model), group_(group), o_(options) {
    for (auto [name, p] : model.named_parameters()) {
      group.broadcast(p, 0)->wait();
      global_.push_back(p.detach().to_float_vector());
      momentum_.emplace_back(global_.back().size(), 0.0f);
    }
  }

  // Collective at the end of every window (steps_done a multiple of H).
  void after_step(int steps_done) {
    if (steps_done % o_.every != 0) return;
    size_t i = 0;
    for (auto [name, p] : model_.named_parameters()) outer_step(p, global_[i], momentum_[i]), ++i;
  }

 private:
  void outer_step(Tensor& p, std::vector<float>& global, std::vector<float>& m) {
    std::vector<float> mine = p.detach().to_float_vector();
    if (o_.diloco)
      for (size_t j = 0; j < mine.size(); ++j) mine[j] = global[j] - mine[j];  // Δ_r = θ_global − θ_r
    Tensor t = Tensor::from_vector(mine, {int64_t(mine.size())});
    group_.all_reduce(t, ReduceOp::kAvg)->wait();  // the mean over the workers: of θ_r, or of Δ_r
    std::vector<float> mean = t.to_float_vector();
    if (o_.diloco) {
      for (size_t j = 0; j < mean.size(); ++j) {
        const float d = mean[j];
        m[j] = o_.momentum * m[j] + d;
        global[j] = global[j] - o_.lr * (d + o_.momentum * m[j]);  // Nesterov: the gradient plus the new momentum
      }
      mean = global;
    }
    p.detach().copy_(Tensor::from_vector(mean, p.shape()));  // every worker: the same parameters again
  }

  nn::Module& model_;
  ProcessGroup& group_;
  LocalSgdOptions o_;
  std::vector<std::vector<float>> global_, momentum_;  // per parameter: θ_global and DiLoCo's outer momentum
};

}  // namespace minidl::dist::naive
