// The grader of exercise ddp (dist/naive/ddp.h; scripts/minidl-exercise check ddp): the naive DataParallel on a
// small model with CS336's hard cases (a tied parameter registered under two names, a frozen one, an unused one,
// a buffer), each rank initialised from its own seed, against one process training on the whole batch.
//
// The oracle is the same model built from rank 0's seed, its gradient that of the global batch's mean loss. A wrong
// gradient is compared with it by its ratio: N times on every parameter is a sum where the mean was asked, 2 times
// on the tied one only is a tensor reduced once per name, the rank's own gradient is no reduction at all.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "autograd/functions.h"
#include "core/rng.h"
#include "ddp.h"
#include "grader.h"
#include "grader_model.h"
#include "nn/module.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;
using namespace exercises::model;

namespace {

Tensor slice(const Tensor& t, const Run& run) { return exercises::model::slice(t, run.rank(), run.size()); }

// The trained parameters, each tensor once, with all its names.
std::vector<std::pair<std::string, Tensor>> unique_trained(const nn::Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : m.named_parameters()) {
    if (!p.requires_grad()) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.second.same(p); });
    if (it == out.end())
      out.emplace_back(name, p);
    else
      it->first += "/" + name;
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// got = k·want + residual: k by least squares, and how far got is from k·want.
std::pair<double, double> ratio(const std::vector<double>& got, const std::vector<double>& want) {
  double gw = 0, ww = 0;
  for (size_t i = 0; i < got.size(); ++i) gw += got[i] * want[i], ww += want[i] * want[i];
  const double k = ww > 0 ? gw / ww : 0;
  double off = 0;
  for (size_t i = 0; i < got.size(); ++i) off = std::max(off, std::abs(got[i] - k * want[i]));
  return {k, off / std::max(1e-12, max_abs(want))};
}

// Compares the averaged gradients of `model` with the oracle's, naming the cause of a difference.
void expect_oracle_gradients(const Run& run, const Net& model, const Net& oracle, const Net& local, int step) {
  const int n = run.size();
  const auto mine = unique_trained(model), want = unique_trained(oracle), alone = unique_trained(local);
  std::vector<std::string> wrong;
  std::vector<double> ks;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& [name, p] = mine[i];
    if (!want[i].second.grad().defined()) continue;  // unused: frozen_and_unused grades it
    if (!p.grad().defined()) fail("parameter ", name, " has no gradient after average_gradients (it is used)");
    const std::vector<double> g = p.grad().to_vector(), o = want[i].second.grad().to_vector();
    double worst = 0;
    for (size_t j = 0; j < g.size(); ++j) worst = std::max(worst, std::abs(g[j] - o[j]));
    if (worst <= 1e-5 * std::max(1.0, max_abs(o))) continue;
    const auto [k, off] = ratio(g, o);
    const std::vector<double> own = alone[i].second.grad().to_vector();
    double own_off = 0;
    for (size_t j = 0; j < g.size(); ++j) own_off = std::max(own_off, std::abs(g[j] - own[j]));
    if (own_off <= 1e-6 * std::max(1.0, max_abs(own)))
      fail("step ", step, ": ", name, " still holds this rank's own gradient (rank ", run.rank(),
           "'s slice): never reduced over the group");
    wrong.push_back(name + (off < 1e-4 ? " (" + std::to_string(k) + "x)" : " (not a multiple)"));
    ks.push_back(off < 1e-4 ? k : NAN);
  }
  if (wrong.empty()) return;
  auto all_near = [&](double target) {
    return std::all_of(ks.begin(), ks.end(), [&](double k) { return std::abs(k - target) < 1e-3 * target; });
  };
  const bool tied_only = wrong.size() == 1 && wrong[0].find('/') != std::string::npos;
  if (wrong.size() == mine.size() - 1 && all_near(double(n)))  // every used one (unused has none)
    fail("step ", step, ": every gradient is N = ", n,
         " times the oracle's: summed, not averaged (kAvg, or divide "
         "by the group's size)");
  if (all_near(1.0 / n)) fail("step ", step, ": the gradients are 1/N of the oracle's: divided by N twice");
  if (tied_only && all_near(2.0))
    fail("step ", step, ": ", wrong[0],
         " is 2x the oracle's, every other gradient right: the tied parameter "
         "(one tensor, two names) reduced twice");
  std::string list;
  for (const std::string& w : wrong) list += (list.empty() ? "" : ", ") + w;
  fail("step ", step, ": gradients differ from one process on the whole batch: ", list);
}

// One process: the model from rank 0's seed, the gradient of the whole batch's mean loss.
void oracle_backward(Net& oracle, int step) {
  auto [x, y] = batch(step);
  oracle.loss(x, y).backward();
}

void expect_same_as_rank_zero(const Run& run, const nn::Module& model, const char* when) {
  Net zero(kRankZeroSeed);
  const auto params = model.named_parameters(), want = zero.named_parameters();
  std::string differ;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].second.to_vector() != want[i].second.to_vector())
      differ += (differ.empty() ? "" : ", ") + params[i].first;
  const auto bufs = model.named_buffers(), want_bufs = zero.named_buffers();
  for (size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i].second.to_vector() != want_bufs[i].second.to_vector())
      differ += (differ.empty() ? "" : ", ") + bufs[i].first + " (a buffer)";
  if (!differ.empty())
    fail(when, ": on rank ", run.rank(), " ", differ,
         " differ from rank 0's: parameters not broadcast from rank 0 "
         "(each rank initialised its model from its own seed)");
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"broadcast",
           "after construction every rank holds rank 0's parameters and buffers",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()));
             dist::naive::DataParallel dp(model, *run.exercise);
             expect_same_as_rank_zero(run, model, "after DataParallel's constructor");
           }},
          {"gradients",
           "average_gradients equals one process's gradient of the whole batch",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank())), oracle(kRankZeroSeed), local(kRankZeroSeed);
             dist::naive::DataParallel dp(model, *run.exercise);
             auto [x, y] = batch(0);
             model.loss(slice(x, run), slice(y, run)).backward();
             local.loss(slice(x, run), slice(y, run)).backward();
             dp.average_gradients();
             oracle_backward(oracle, 0);
             expect_oracle_gradients(run, model, oracle, local, 0);
           },
           {"ddp.h:1"}},
          {"frozen_and_unused",
           "a frozen parameter never changes, an unused one gets no gradient",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()));
             dist::naive::DataParallel dp(model, *run.exercise);
             const std::vector<double> frozen = Net(kRankZeroSeed).frozen.to_vector();
             for (int step = 0; step < 2; ++step) {
               auto [x, y] = batch(step);
               model.loss(slice(x, run), slice(y, run)).backward();
               dp.average_gradients();
               if (model.unused.grad().defined())
                 fail("the unused parameter 'unused' got a gradient in average_gradients (the loss never reads it): ",
                      "an unused parameter must keep none, so the optimizer leaves it alone");
               if (model.frozen.grad().defined())
                 fail("the frozen parameter 'frozen' (requires_grad false) got a gradient in average_gradients");
               if (model.frozen.to_vector() != frozen)
                 fail("the frozen parameter 'frozen' changed: it must keep rank 0's value");
               model.zero_grad();
             }
           },
           {"ddp.h:1"}},
          {"training",
           "5 SGD steps equal one process's, after every step (allclose 1e-5)",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank())), oracle(kRankZeroSeed);
             dist::naive::DataParallel dp(model, *run.exercise);
             auto sgd = [](const nn::Module& m) {
               for (auto& [name, p] : unique_trained(m)) {
                 if (!p.grad().defined()) continue;
                 p.copy_(sub(p.detach(), mul(p.grad(), 0.1)));
                 p.grad().zero_();
               }
             };
             for (int step = 0; step < 5; ++step) {
               Net local(kRankZeroSeed);
               local.load_state_dict(oracle.state_dict());
               auto [x, y] = batch(step);
               model.loss(slice(x, run), slice(y, run)).backward();
               local.loss(slice(x, run), slice(y, run)).backward();
               dp.average_gradients();
               oracle_backward(oracle, step);
               expect_oracle_gradients(run, model, oracle, local, step);
               sgd(model);
               sgd(oracle);
               for (auto& [name, p] : model.named_parameters()) {
                 const std::vector<double> a = p.to_vector(), b = oracle.state_dict().at(name).to_vector();
                 for (size_t j = 0; j < a.size(); ++j)
                   if (std::abs(a[j] - b[j]) > 1e-5 * std::max(1.0, std::abs(b[j])))
                     fail("after step ", step, " ", name, "[", j, "] = ", a[j], ", one process has ", b[j]);
               }
             }
           },
           {"ddp.h:1"}},
          {"traffic",
           "each trained parameter with a gradient all-reduced once: its numel, no more",
           {2, 3},
           1,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()));
             dist::naive::DataParallel dp(model, *run.exercise);
             auto [x, y] = batch(0);
             model.loss(slice(x, run), slice(y, run)).backward();
             const size_t before = dist::flight_entries().size();
             dp.average_gradients();
             const auto entries = dist::flight_entries();
             int64_t reduced = 0;
             for (size_t i = before; i < entries.size(); ++i) {
               const dist::FlightEntry& e = entries[i];
               if (e.group != "exercise") continue;
               if (e.op != "all_reduce")
                 fail("average_gradients called ", e.op, ": one all-reduce per gradient is all it needs");
               reduced += e.count;
             }
             int64_t expected = 0;
             for (auto& [name, p] : unique_trained(model))
               if (p.grad().defined()) expected += p.numel();
             if (reduced == expected + model.tied.numel())
               fail("average_gradients all-reduced ", reduced, " elements, ", model.tied.numel(), " more than the ",
                    expected,
                    " of the gradients: the tied parameter wte/lm_head (one tensor, two names) reduced "
                    "twice; reduce each tensor once");
             if (reduced != expected)
               fail("average_gradients all-reduced ", reduced,
                    " elements; the trained parameters with a gradient, "
                    "each tensor once, have ",
                    expected);
           },
           {"ddp.h:1"}},
      });
}
