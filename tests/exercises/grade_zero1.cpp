// The grader of exercise zero1 (dist/naive/zero1.h; scripts/minidl-exercise check zero1): the naive sharded AdamW
// against one process's AdamW on the whole batch, and the instruments that prove the sharding: the shard's pieces
// (what the optimizer holds), the traffic (a reduce-scatter and an all-gather, never an all-reduce) and the
// optimizer state (2 x the shard, not 2 x the model).
//
// The averaged gradient is read from the shard's pieces (their .grad() views the gradient shard): AdamW hardly
// changes when every gradient is N times too large (it divides by the gradient's own size), so the parameters alone
// would not show a sum where the mean was asked.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dist/shard.h"
#include "grader.h"
#include "grader_model.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "zero1.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;
using namespace exercises::model;

namespace {

const optim::AdamWOptions kAdamW{.lr = 1e-2};

std::vector<optim::ParamGroup> groups_of(const Net& m) { return optim::decay_groups(m.named_parameters(), 0.1); }

// The flat vector of the groups' parameters (their gradients with grads), in the order the groups list them.
std::vector<double> flat(const std::vector<optim::ParamGroup>& groups, bool grads) {
  std::vector<double> out;
  for (const optim::ParamGroup& g : groups)
    for (const Tensor& p : g.params) {
      const std::vector<double> v = grads ? p.grad().to_vector() : p.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

// This rank's shard of the flat vector of psi elements: [first, end), padded as the exercise pads it.
dist::ShardRange my_shard(int64_t psi, const Run& run) {
  const int64_t shard = dist::padded_numel(psi, run.size()) / run.size(), first = run.rank() * shard;
  return {std::min(first, psi), std::min(first + shard, psi)};
}

int64_t pieces_numel(dist::naive::Zero1AdamW& zero) {
  int64_t n = 0;
  for (const optim::ParamGroup& g : zero.optimizer().param_groups())
    for (const Tensor& p : g.params) n += p.numel();
  return n;
}

void expect_pieces(dist::naive::Zero1AdamW& zero, int64_t psi, const Run& run) {
  const dist::ShardRange mine = my_shard(psi, run);
  const int64_t held = pieces_numel(zero);
  if (held != mine.size())
    fail("rank ", run.rank(), "'s optimizer holds ", held, " elements; its shard of the ", psi,
         "-element flat vector "
         "is [",
         mine.begin, ", ", mine.end, "), ", mine.size(), " elements",
         held == psi ? ": every parameter whole, not the shard's pieces" : "");
  for (const optim::ParamGroup& g : zero.optimizer().param_groups())
    for (const Tensor& p : g.params)
      if (!p.grad().defined() || p.grad().numel() != p.numel())
        fail("a piece of the shard has no gradient of its size: it must view the gradient shard");
}

// `steps` steps of the exercise and of one process's AdamW, compared after each.
void train_and_compare(Run& run, int steps) {
  Net model(kRankZeroSeed + uint64_t(run.rank()), false), oracle(kRankZeroSeed, false);
  const auto model_groups = groups_of(model), oracle_groups = groups_of(oracle);
  dist::naive::Zero1AdamW zero(model, *run.exercise, model_groups, kAdamW);
  optim::AdamW adamw(oracle_groups, kAdamW);
  const int64_t psi = int64_t(flat(oracle_groups, false).size());
  const dist::ShardRange mine = my_shard(psi, run);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step);
    model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
    oracle.loss(x, y).backward();
    const std::vector<double> before = flat(model_groups, false), want_grad = flat(oracle_groups, true);
    zero.step();
    adamw.step();
    oracle.zero_grad();
    // The gradient shard, from the pieces: the average over ranks of this rank's shard.
    std::vector<double> shard_grad;
    for (const optim::ParamGroup& g : zero.optimizer().param_groups())
      for (const Tensor& p : g.params) {
        const std::vector<double> v = p.grad().to_vector();
        shard_grad.insert(shard_grad.end(), v.begin(), v.end());
      }
    double k_num = 0, k_den = 0, worst = 0;
    int64_t worst_at = 0;
    for (int64_t i = mine.begin; i < mine.end && size_t(i - mine.begin) < shard_grad.size(); ++i) {
      const double g = shard_grad[size_t(i - mine.begin)], o = want_grad[size_t(i)];
      k_num += g * o, k_den += o * o;
      const double off = std::abs(g - o) / std::max(1e-3, std::abs(o));
      if (off > worst) worst = off, worst_at = i;
    }
    if (worst > 1e-4) {
      const double k = k_den > 0 ? k_num / k_den : 0;
      if (std::abs(k - run.size()) < 1e-3 * run.size())
        fail("step ", step, ": the gradient shard is N = ", run.size(), " times the oracle's: summed, not averaged");
      fail("step ", step, ": rank ", run.rank(), "'s gradient shard differs from one process's gradient: flat element ",
           worst_at, " is ", shard_grad[size_t(worst_at - mine.begin)], ", the average over the ranks is ",
           want_grad[size_t(worst_at)]);
    }
    const std::vector<double> got = flat(model_groups, false), want = flat(oracle_groups, false);
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - want[i]) <= 1e-5 * std::max(1.0, std::abs(want[i]))) continue;
      const bool outside = int64_t(i) < mine.begin || int64_t(i) >= mine.end;
      if (outside && got[i] == before[i])
        fail("step ", step, ": rank ", run.rank(), "'s element ", i, " of the flat parameters, outside its shard [",
             mine.begin, ", ", mine.end,
             "), kept its old value: the other ranks' updated shards never arrived (the "
             "all-gather is missing)");
      fail("step ", step, ": flat parameter ", i, " is ", got[i], ", one process's AdamW has ", want[i],
           outside ? " (outside this rank's shard: gathered from a wrong place?)" : " (in this rank's shard)");
    }
    for (const optim::ParamGroup& g : model_groups)
      for (const Tensor& p : g.params)
        if (p.grad().defined() && p.grad().to_vector() != std::vector<double>(size_t(p.numel()), 0.0))
          fail("step ", step, ": the model's gradients are not zeroed after step()");
  }
}

// `steps` steps clipped to max_norm: the norm step() returns and the parameters against one process's
// clip_grad_norm and AdamW; a norm equal to this rank's shard's alone is named.
void clip_and_compare(Run& run, int steps, double max_norm) {
  Net model(kRankZeroSeed + uint64_t(run.rank()), false), oracle(kRankZeroSeed, false);
  const auto model_groups = groups_of(model), oracle_groups = groups_of(oracle);
  dist::naive::Zero1AdamW zero(model, *run.exercise, model_groups, kAdamW);
  optim::AdamW adamw(oracle_groups, kAdamW);
  const dist::ShardRange mine = my_shard(int64_t(flat(oracle_groups, false).size()), run);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step);
    model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
    oracle.loss(x, y).backward();
    const std::vector<double> g = flat(oracle_groups, true);
    double local = 0;
    for (int64_t i = mine.begin; i < mine.end; ++i) local += g[size_t(i)] * g[size_t(i)];
    local = std::sqrt(local);
    const double got = zero.step(max_norm), want = optim::clip_grad_norm(oracle.parameters(), max_norm);
    adamw.step();
    oracle.zero_grad();
    if (std::abs(got - want) > 1e-5 * want) {
      if (run.size() > 1 && std::abs(got - local) <= 1e-5 * local)
        fail("step ", step, ": grad_norm() is ", got, ", the norm of rank ", run.rank(),
             "'s shard alone (the whole gradient's is ", want,
             "): the norm not summed over the group, so each rank clips by a factor of its own");
      fail("step ", step, ": step(", max_norm, ") returned the norm ", got, "; the whole averaged gradient's is ",
           want);
    }
    const std::vector<double> params = flat(model_groups, false), oracle_params = flat(oracle_groups, false);
    for (size_t i = 0; i < params.size(); ++i)
      if (std::abs(params[i] - oracle_params[i]) > 1e-5 * std::max(1.0, std::abs(oracle_params[i])))
        fail("step ", step, ": flat parameter ", i, " is ", params[i], "; one process, clipped to ", max_norm, ", has ",
             oracle_params[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"shard_pieces",
           "the optimizer holds this rank's shard of the flat vector, each piece with its gradient",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()), false);
             const auto groups = groups_of(model);
             dist::naive::Zero1AdamW zero(model, *run.exercise, groups, kAdamW);
             expect_pieces(zero, int64_t(flat(groups, false).size()), run);
           }},
          {"step",
           "3 steps equal one process's AdamW on the whole batch (1e-5), the gradient shard its average",
           {2, 3},
           5,
           [](Run& run) { train_and_compare(run, 3); },
           {"zero1.h:1"}},
          {"clipping",
           "3 steps clipped to norm 0.05: the norm of the whole averaged gradient and the parameters equal one "
           "process's clip_grad_norm and AdamW",
           {2, 3},
           5,
           [](Run& run) { clip_and_compare(run, 3, 0.05); },
           {"zero1.h:1", "zero1.h:2"}},
          {"traffic",
           "one step: a reduce-scatter and an all-gather of the padded flat vector, no all-reduce",
           {2, 3},
           1,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()), false);
             const auto groups = groups_of(model);
             dist::naive::Zero1AdamW zero(model, *run.exercise, groups, kAdamW);
             auto [x, y] = batch(0);
             model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
             const size_t before = dist::flight_entries().size();
             zero.step();
             const auto entries = dist::flight_entries();
             const int n = run.size();
             const int64_t padded = dist::padded_numel(int64_t(flat(groups, false).size()), n);
             int64_t scattered = 0, gathered = 0, all_reduced = 0;
             for (size_t i = before; i < entries.size(); ++i) {
               const dist::FlightEntry& e = entries[i];
               if (e.group != "exercise") continue;
               if (e.op == "reduce_scatter") scattered += e.count;
               if (e.op == "all_gather") gathered += e.count;
               if (e.op == "all_reduce") all_reduced += e.count;
             }
             if (all_reduced > 0)
               fail("step() all-reduced ", all_reduced,
                    " gradient elements: an all-reduce where a reduce-scatter "
                    "suffices (it moves 2(N-1)/N of the gradient, each rank then using 1/N of it; ZeRO-1 "
                    "reduce-scatters, (N-1)/N)");
             if (scattered != padded || gathered != padded)
               fail("step() reduce-scattered ", scattered, " and all-gathered ", gathered,
                    " elements; ZeRO-1 moves "
                    "the padded flat vector, ",
                    padded, " elements, once through each");
           },
           {"zero1.h:1"}},
          {"optimizer_state",
           "AdamW's m and v hold this rank's shard only: 2 x Psi/N elements, not 2 x Psi",
           {2, 3},
           1,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()), false);
             const auto groups = groups_of(model);
             const int64_t psi = int64_t(flat(groups, false).size());
             dist::naive::Zero1AdamW zero(model, *run.exercise, groups, kAdamW);
             const optim::AdamWState s = zero.optimizer().state();
             const int64_t held = s.m.numel() + s.v.numel(), want = 2 * my_shard(psi, run).size();
             if (held != want)
               fail("rank ", run.rank(), "'s AdamW state holds ", held, " elements; m and v of its shard are ", want,
                    held == 2 * psi ? ": the whole model's, as without ZeRO" : "");
           }},
      });
}
