// The grader of exercise zero3 (dist/naive/zero3.h; scripts/minidl-exercise check zero3): the naive ZeRO-3 on a
// two-block GPT, each rank initialised from its own seed, against one process training on the whole batch with SGD;
// the blocks' lifetime (whole only between a gather and a release: never after a forward or a backward); and the
// traffic (two all-gathers and one reduce-scatter of each block per step).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/shard.h"
#include "grader.h"
#include "nn/gpt.h"
#include "optim/sgd.h"
#include "zero3.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8, kRows = 12;
constexpr uint64_t kRankZeroSeed = 1337;
const nn::GPTConfig kConfig{kVocab, kSeq, 2, 2, 16, 0.0, true};

std::pair<Tensor, Tensor> batch(int step) {
  std::vector<int32_t> x(kRows * kSeq), y(kRows * kSeq);
  Philox rng(99, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {kRows, kSeq}), Tensor::from_vector(y, {kRows, kSeq})};
}

Tensor rows(const Tensor& t, const Run& run) {
  const int64_t n = kRows / run.size();
  return t.narrow(0, run.rank() * n, n);
}

std::vector<int64_t> whole_blocks(const nn::GPT& model) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < model.config().n_layer; ++i)
    if (model.block_parameters(i)[0].impl()->storage->data() != nullptr) out.push_back(i);
  return out;
}

void expect_released(const nn::GPT& model, const char* when, const char* who) {
  const std::vector<int64_t> whole = whole_blocks(model);
  if (!whole.empty())
    fail("block ", whole[0], " is still whole ", when, " (", whole.size(), " of ", model.config().n_layer,
         " blocks): block not freed; ", who, " must release it");
}

// Each block shard's gradient against one process's gradient of the whole batch at the same flat elements.
void expect_shard_gradients(const Run& run, const dist::naive::Zero3& zero, const Tensor& x, const Tensor& y) {
  nn::GPT one(kConfig, kRankZeroSeed);
  one.loss(x, y).backward();
  const std::vector<Tensor> shards = zero.parameters();
  for (int64_t i = 0; i < kConfig.n_layer; ++i) {
    std::vector<double> flat;
    for (const Tensor& p : one.block_parameters(i)) {
      const std::vector<double> g = p.grad().to_vector();
      flat.insert(flat.end(), g.begin(), g.end());
    }
    const Tensor& shard = shards[size_t(i)];
    if (!shard.grad().defined()) fail("block ", i, "'s shard has no gradient after the backward");
    const std::vector<double> got = shard.grad().to_vector();
    const int64_t first = run.rank() * shard.numel();
    double gw = 0, ww = 0, worst = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      const size_t at = size_t(first) + j;
      const double want = at < flat.size() ? flat[at] : 0.0;
      gw += got[j] * want, ww += want * want;
      worst = std::max(worst, std::abs(got[j] - want));
    }
    if (worst <= 1e-5) continue;
    const double k = ww > 0 ? gw / ww : 0;
    if (std::abs(k - run.size()) < 1e-3 * run.size())
      fail("block ", i, "'s gradient shard is N = ", run.size(), " times one process's: summed, not averaged");
    fail("block ", i, "'s gradient shard on rank ", run.rank(),
         " differs from one process's gradient at its elements "
         "by up to ",
         worst, " (the shard of another rank, or a gradient left out of the flat buffer?)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"gather_release",
           "a block is whole only between gather and release, and gathers rank 0's weights",
           {2, 3},
           5,
           [](Run& run) {
             nn::GPT model(kConfig, kRankZeroSeed + uint64_t(run.rank())), zero_model(kConfig, kRankZeroSeed);
             dist::naive::Zero3 zero(model, *run.exercise);
             expect_released(model, "after construction", "the constructor's release(i)");
             for (int64_t i = 0; i < kConfig.n_layer; ++i) {
               zero.gather(i);
               const auto mine = model.block_parameters(i), want = zero_model.block_parameters(i);
               for (size_t k = 0; k < mine.size(); ++k)
                 if (mine[k].to_vector() != want[k].to_vector())
                   fail("after gather(", i, ") block ", i, "'s parameter ", k, " is not rank 0's weight: the shards ",
                        "gathered in the wrong order, or from the wrong place");
               zero.release(i);
               if (!whole_blocks(model).empty()) fail("release(", i, ") left block ", i, " whole: block not freed");
             }
           }},
          {"training",
           "3 SGD steps equal one process's on the whole batch (1e-4); blocks freed after each pass",
           {2, 3},
           5,
           [](Run& run) {
             nn::GPT model(kConfig, kRankZeroSeed + uint64_t(run.rank())), oracle(kConfig, kRankZeroSeed);
             dist::naive::Zero3 zero(model, *run.exercise);
             optim::SGD opt({{zero.parameters(), 0.0}}, {.lr = 0.1});
             optim::SGD one({{oracle.parameters(), 0.0}}, {.lr = 0.1});
             for (int step = 0; step < 3; ++step) {
               auto [x, y] = batch(step);
               Tensor loss = model.loss(rows(x, run), rows(y, run));
               expect_released(model, "after the forward", "after_block");
               loss.backward();
               expect_released(model, "after the backward", "on_block_grad_ready");
               if (step == 0) expect_shard_gradients(run, zero, x, y);
               opt.step();
               opt.zero_grad();
               oracle.loss(x, y).backward();
               one.step();
               one.zero_grad();
             }
             for (int64_t i = 0; i < kConfig.n_layer; ++i) zero.gather(i);
             const auto mine = model.named_parameters(), want = oracle.named_parameters();
             for (size_t k = 0; k < mine.size(); ++k) {
               const std::vector<double> a = mine[k].second.to_vector(), b = want[k].second.to_vector();
               for (size_t j = 0; j < a.size(); ++j)
                 if (std::abs(a[j] - b[j]) > 1e-4 * std::max(1.0, std::abs(b[j])))
                   fail("after 3 steps ", mine[k].first, "[", j, "] is ", a[j], ", one process's ", b[j],
                        std::abs(a[j] - b[j]) > 10 * std::abs(b[j]) ? " (a gradient shard not averaged, or not "
                                                                      "scattered to its shard?)"
                                                                    : "");
             }
           },
           {"zero3.h:1", "zero3.h:2"}},
          {"traffic",
           "per step: each block all-gathered twice (forward, backward) and reduce-scattered once",
           {2, 3},
           1,
           [](Run& run) {
             nn::GPT model(kConfig, kRankZeroSeed + uint64_t(run.rank()));
             dist::naive::Zero3 zero(model, *run.exercise);
             auto [x, y] = batch(0);
             const size_t before = dist::flight_entries().size();
             model.loss(rows(x, run), rows(y, run)).backward();
             const auto entries = dist::flight_entries();
             int64_t gathers = 0, scatters = 0, gathered = 0, scattered = 0, padded = 0;
             for (int64_t i = 0; i < kConfig.n_layer; ++i) {
               int64_t numel = 0;
               for (const Tensor& p : model.block_parameters(i)) numel += p.numel();
               padded += dist::padded_numel(numel, run.size());
             }
             for (size_t i = before; i < entries.size(); ++i) {
               const dist::FlightEntry& e = entries[i];
               if (e.group != "exercise") continue;
               if (e.op == "all_gather") ++gathers, gathered += e.count;
               if (e.op == "reduce_scatter") ++scatters, scattered += e.count;
             }
             const int64_t L = kConfig.n_layer;
             if (gathers != 2 * L || gathered != 2 * padded)
               fail("a step all-gathered ", gathers, " times (", gathered, " elements); each of the ", L,
                    " blocks is "
                    "gathered before its forward and before its backward: ",
                    2 * L, " times, ", 2 * padded, " elements");
             if (scatters != L || scattered != padded)
               fail("a step reduce-scattered ", scatters, " times (", scattered,
                    " elements); each block's gradient "
                    "once: ",
                    L, " times, ", padded, " elements");
           },
           {"zero3.h:1", "zero3.h:2"}},
      });
}
