// The grader of exercise tensor_parallel (dist/naive/tensor_parallel.h; scripts/minidl-exercise check
// tensor_parallel): f and g alone, the column-then-row MLP's slices, the MLP and the attention against the whole
// layers (forward, the input's gradient, within 1e-5), and the traffic (one all-reduce of (B, T, C) per layer each
// way). Every rank builds the same whole layers from one seed, so each can compare with them.
//
// Diagnoses: an input gradient that sums, over the ranks, to the whole layer's is each rank's partial: f's backward
// all-reduce is missing; an output that sums to it is g's forward all-reduce missing; an output off by (N-1) times
// the row layer's bias is that bias added on every rank before g.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/rng.h"
#include "grader.h"
#include "nn/gpt.h"
#include "tensor_parallel.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;

namespace {

const nn::GPTConfig kConfig{13, 8, 1, 6, 12, 0.0, true};  // 6 heads, width 12, hidden 48: split 2 or 3 ways
constexpr int64_t kBatch = 2;

Tensor random(const Shape& shape, uint64_t seed, double scale) {
  return mul(Tensor::randn(shape, Philox(seed, 0)), scale).detach();
}

struct Whole {
  std::shared_ptr<nn::DropoutContext> dropout = std::make_shared<nn::DropoutContext>();
  nn::MLP mlp{kConfig, 0, dropout};
  nn::CausalSelfAttention attn{kConfig, 1, dropout};
  Whole() {
    uint64_t seed = 1;
    for (nn::Module* m : {static_cast<nn::Module*>(&mlp), static_cast<nn::Module*>(&attn)})
      for (auto [name, p] : m->named_parameters()) p.copy_(random(p.shape(), seed++, 0.3));
  }
};

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<double> summed_over_ranks(const Run& run, const Tensor& t) {
  Tensor s = t.detach().clone();
  run.grader->all_reduce(s, dist::ReduceOp::kSum)->wait();
  return s.to_vector();
}

// One layer, split and whole, forward and backward against the same dL/dy; names what is wrong.
void compare_layer(const Run& run, const char* layer, const std::function<Tensor(const Tensor&)>& whole,
                   const std::function<Tensor(const Tensor&)>& split, const Tensor& row_bias) {
  const Tensor x = random({kBatch, kConfig.block_size, kConfig.n_embd}, 100, 1.0);
  const Tensor dy = random(x.shape(), 101, 1.0);
  Tensor x1 = x.clone().set_requires_grad(true), x2 = x.clone().set_requires_grad(true);
  Tensor y1 = whole(x1), y2 = split(x2);
  sum(mul(y1, dy)).backward();
  sum(mul(y2, dy)).backward();
  const std::vector<double> want = y1.to_vector(), got = y2.to_vector();
  if (max_diff(got, want) > 1e-5) {
    std::vector<double> extra_bias = want;
    const std::vector<double> b = row_bias.to_vector();
    for (size_t i = 0; i < extra_bias.size(); ++i) extra_bias[i] += (run.size() - 1) * b[i % b.size()];
    if (max_diff(got, extra_bias) <= 1e-5)
      fail(layer, ": the output is the whole layer's plus ", run.size() - 1,
           " times c_proj's bias: the row-parallel "
           "layer's bias added on every rank before g (add it once, after)");
    const std::vector<double> summed = summed_over_ranks(run, y2);  // with a bias added once per rank, or not
    if (max_diff(summed, want) <= 1e-4 * run.size() || max_diff(summed, extra_bias) <= 1e-4 * run.size())
      fail(layer,
           ": the output is this rank's partial product, which summed over the ranks is the whole layer's: "
           "g's forward all-reduce is missing");
    fail(layer, ": the forward differs from the whole layer's by up to ", max_diff(got, want));
  }
  if (!x2.grad().defined()) fail(layer, ": the input has no gradient: the forward is cut off from x");
  const std::vector<double> gwant = x1.grad().to_vector(), ggot = x2.grad().to_vector();
  if (max_diff(ggot, gwant) > 1e-5) {
    if (max_diff(summed_over_ranks(run, x2.grad()), gwant) <= 1e-4 * run.size())
      fail(layer,
           ": forward right, the input gradient a local partial (summed over the ranks it is the whole "
           "layer's): f's backward all-reduce missing");
    std::vector<double> n_times = gwant;
    for (double& v : n_times) v *= run.size();
    if (max_diff(ggot, n_times) <= 1e-4 * run.size())
      fail(layer, ": the input gradient is N = ", run.size(),
           " times the whole layer's: summed twice (g's backward "
           "must be the identity)");
    fail(layer, ": the input gradient differs from the whole layer's by up to ", max_diff(ggot, gwant));
  }
}

int64_t all_reduced(size_t from) {
  int64_t n = 0;
  const auto entries = dist::flight_entries();
  for (size_t i = from; i < entries.size(); ++i)
    if (entries[i].group == "exercise") {
      if (entries[i].op != "all_reduce") fail("the layer called ", entries[i].op, ": f and g need all-reduces only");
      n += 1;
    }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"f_and_g",
           "f: identity forward, all-reduce backward; g: all-reduce forward, identity backward",
           {2, 3},
           5,
           [](Run& run) {
             const Tensor x = random({3, 4}, 7, 1.0), dy = random({3, 4}, 8 + uint64_t(run.rank()), 1.0);
             Tensor xf = x.clone().set_requires_grad(true);
             Tensor yf = dist::naive::f(xf, *run.exercise);
             if (max_diff(yf.to_vector(), x.to_vector()) > 0)
               fail("f's forward changed its input: f is the identity forward (its all-reduce is backward's)");
             sum(mul(yf, dy)).backward();
             const std::vector<double> dy_sum = summed_over_ranks(run, dy);
             if (max_diff(xf.grad().to_vector(), dy.to_vector()) == 0 && run.size() > 1)
               fail("f's backward returned this rank's gradient: f's backward all-reduce missing");
             if (max_diff(xf.grad().to_vector(), dy_sum) > 1e-6)
               fail("f's backward is not the sum over the ranks of the incoming gradient");
             Tensor xg = random({3, 4}, 20 + uint64_t(run.rank()), 1.0).set_requires_grad(true);
             Tensor yg = dist::naive::g(xg, *run.exercise);
             if (max_diff(yg.to_vector(), summed_over_ranks(run, xg)) > 1e-6)
               fail("g's forward is not the sum over the ranks of its input: g's forward all-reduce missing");
             sum(mul(yg, dy)).backward();
             if (max_diff(xg.grad().to_vector(), dy.to_vector()) > 0)
               fail("g's backward changed the gradient", max_diff(xg.grad().to_vector(), dy_sum) < 1e-6
                                                             ? ": it all-reduces it (g's backward is the identity)"
                                                             : "");
           }},
          {"mlp_slices",
           "c_fc's columns and bias, c_proj's rows of this rank; c_proj's bias whole",
           {2, 3},
           5,
           [](Run& run) {
             Whole w;
             dist::naive::ParallelMLP mlp(w.mlp, *run.exercise);
             const int64_t h = 4 * kConfig.n_embd / run.size(), first = run.rank() * h;
             auto expect = [&](const char* what, const Tensor& mine, const Tensor& want) {
               if (mine.shape() != want.shape() || mine.to_vector() != want.contiguous().to_vector())
                 fail(what, " on rank ", run.rank(), " is not its slice of the whole layer (shape ", mine.shape(),
                      ", expected ", want.shape(), ")");
               if (!mine.requires_grad()) fail(what, " is not a parameter (requires_grad)");
             };
             expect("fc_weight", mlp.fc_weight, w.mlp.c_fc->weight.detach().narrow(1, first, h));
             expect("fc_bias", mlp.fc_bias, w.mlp.c_fc->bias.detach().narrow(0, first, h));
             expect("proj_weight", mlp.proj_weight, w.mlp.c_proj->weight.detach().narrow(0, first, h));
             expect("proj_bias", mlp.proj_bias, w.mlp.c_proj->bias.detach());
           }},
          {"mlp",
           "the column-then-row MLP equals the whole one: forward and input gradient (1e-5)",
           {2, 3},
           5,
           [](Run& run) {
             Whole w;
             dist::naive::ParallelMLP mlp(w.mlp, *run.exercise);
             compare_layer(
                 run, "MLP", [&](const Tensor& x) { return w.mlp.forward(x); },
                 [&](const Tensor& x) { return mlp.forward(x); }, w.mlp.c_proj->bias.detach());
           },
           {"tensor_parallel.h:1", "tensor_parallel.h:2", "tensor_parallel.h:3"}},
          {"attention",
           "the head-split attention equals the whole one: forward and input gradient (1e-5)",
           {2, 3},
           5,
           [](Run& run) {
             Whole w;
             dist::naive::ParallelAttention attn(w.attn, *run.exercise);
             compare_layer(
                 run, "attention", [&](const Tensor& x) { return w.attn.forward(x); },
                 [&](const Tensor& x) { return attn.forward(x); }, w.attn.c_proj->bias.detach());
           },
           {"tensor_parallel.h:1", "tensor_parallel.h:2"}},
          {"traffic",
           "one all-reduce per layer forward (g) and one backward (f), nothing else",
           {2, 3},
           1,
           [](Run& run) {
             Whole w;
             dist::naive::ParallelMLP mlp(w.mlp, *run.exercise);
             Tensor x = random({kBatch, kConfig.block_size, kConfig.n_embd}, 100, 1.0).set_requires_grad(true);
             size_t at = dist::flight_entries().size();
             Tensor y = mlp.forward(x);
             const int64_t forward = all_reduced(at);
             at = dist::flight_entries().size();
             sum(y).backward();
             const int64_t backward = all_reduced(at);
             if (forward != 1 || backward != 1)
               fail("the MLP all-reduced ", forward, " times forward and ", backward,
                    " times backward; Megatron's "
                    "column-then-row layer needs one each (g forward, f backward)");
           },
           {"tensor_parallel.h:3"}},
      });
}
