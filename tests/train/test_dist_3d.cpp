// dp × tp × pp × ZeRO together (train::build_model_and_sync) against one process, at 4 and 8 ranks, for GPT-2 and
// for Llama: for each grid the world size allows, three AdamW steps with clipping active (the clip is far below
// the gradient norm). Every step's loss, and its gradient norm before clipping, equal one process's within 1e-5
// relative: the norm counts each logical parameter once — the tp-replicated LayerNorms, wpe and row-parallel biases,
// the duplicated tied wte of the first and last stage, ZeRO's shards over dp — which a norm counting any of them twice
// misses by percents. The fp16 overflow flag is combined over the same groups: a rank whose gradients overflow makes
// every rank skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/topology.h"
#include "support/mpi_test.h"
#include "train/parallel_model.h"
#include "train/step.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8, kRows = 8, kLayers = 4;

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

// GPT-2, or Llama (nn/llama.h) with grouped-query attention (4 query heads on 2 kv heads: tp 2 splits both) and
// an untied head: the same plan-driven parallelism, the same oracle.
bool g_llama = false;

nn::GPTConfig model_config() {
  nn::GPTConfig c{kVocab, kSeq, kLayers, g_llama ? 4 : 2, 16, 0.0, !g_llama};
  if (g_llama) {
    c.arch = nn::GPTConfig::Arch::kLlama;
    c.n_kv_head = 2;
    c.intermediate_size = 24;
    c.tie_embeddings = false;
  }
  return c;
}

data::Batch global_batch(int step) {
  std::vector<int32_t> x(kRows * kSeq), y(kRows * kSeq);
  Philox rng(11, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {kRows, kSeq}), Tensor::from_vector(y, {kRows, kSeq})};
}

struct Grid3 {
  int dp, tp, pp, zero;
  bool sequence_parallel = false;
};

std::string name(const Grid3& g) {
  return "dp" + std::to_string(g.dp) + " tp" + std::to_string(g.tp) + " pp" + std::to_string(g.pp) + " zero" +
         std::to_string(g.zero) + (g.sequence_parallel ? " sp" : "");
}

// The grids of this world size (dp · tp · pp = world).
std::vector<Grid3> grids(int world) {
  if (world == 4)
    return {{1, 2, 2, 0},       {1, 2, 2, 0, true}, {2, 2, 1, 1}, {2, 2, 1, 2, true},
            {2, 2, 1, 3, true}, {2, 1, 2, 1},       {2, 1, 2, 2}, {1, 1, 4, 1}};
  if (world == 8) return {{2, 2, 2, 0}, {2, 2, 2, 1, true}, {2, 2, 2, 2}, {1, 2, 4, 0}, {2, 1, 4, 1}};
  return {};
}

train::TrainConfig train_config(const Grid3& g) {
  train::TrainConfig c;
  c.layers = kLayers;
  c.heads = g_llama ? 4 : 2;
  c.embd = 16;
  if (g_llama) {
    c.model = "llama";
    c.kv_heads = 2;
    c.ffn = 24;
    c.untie = true;
  }
  c.seq = kSeq;
  c.batch = kRows;
  c.dp = g.dp;
  c.tp = g.tp;
  c.pp = g.pp;
  c.zero = g.zero;
  c.sequence_parallel = g.sequence_parallel;
  c.weight_decay = 0.1;
  return c;
}

void expect_steps_match(const Grid3& g) {
  SCOPED_TRACE(name(g));
  const train::TrainConfig cfg = train_config(g);
  cfg.validate(ctx().world_size());
  dist::Topology topo(ctx().world(), {g.dp, g.tp, g.pp}, "mpi");
  const int64_t local = kRows / g.dp, first = topo.coord().dp * local;
  train::ParallelModel m = train::build_model_and_sync(cfg, model_config(), topo, Device::cpu(), first, {});
  optim::AdamW opt(m.sync->optimizer_groups(optim::decay_groups(m.stage->named_parameters(), 0.1)),
                   optim::AdamWOptions{.lr = 1e-2});
  train::StepOptions o;
  o.lr = 1e-2;
  o.grad_clip = 0.05;
  o.grad_sync = m.sync.get();

  // One process: the whole model over the same micro-batches (pp: M = pp per dp rank).
  nn::GPT whole(model_config(), 1337);
  whole.train();
  optim::AdamW ref_opt(optim::decay_groups(whole.named_parameters(), 0.1), optim::AdamWOptions{.lr = 1e-2});
  train::StepOptions ro = o;
  ro.grad_sync = &train::GradSync::one_process();
  ro.micro_batches = int64_t(g.dp) * (g.pp > 1 ? g.pp : 1);

  double worst_loss = 0, worst_norm = 0;
  for (int step = 0; step < 3; ++step) {
    const data::Batch b = global_batch(step);
    const train::StepResult want = train::train_step(whole, ref_opt, b, ro);
    const data::Batch mine{b.x.narrow(0, first, local), b.y.narrow(0, first, local)};
    train::StepResult got = train::train_step(*m.stage, opt, mine, o);
    got.loss = train::sum_over(topo.dp_group(), got.loss) / g.dp;
    EXPECT_GT(want.grad_norm, 4 * o.grad_clip) << "clipping must be active for the norm to matter";
    EXPECT_LE(std::abs(got.loss - want.loss), 1e-5 * want.loss)
        << "step " << step << ": loss " << got.loss << " vs " << want.loss;
    EXPECT_LE(std::abs(got.grad_norm - want.grad_norm), 1e-5 * want.grad_norm)
        << "step " << step << ": norm " << got.grad_norm << " vs " << want.grad_norm;
    worst_loss = std::max(worst_loss, std::abs(got.loss - want.loss) / want.loss);
    worst_norm = std::max(worst_norm, std::abs(got.grad_norm - want.grad_norm) / want.grad_norm);
  }
  if (ctx().rank() == 0)
    std::printf("%-8s %-24s loss rel %.2e  norm rel %.2e\n", g_llama ? "llama" : "gpt2", name(g).c_str(), worst_loss,
                worst_norm);
}

}  // namespace

TEST(ThreeD, StepsAndClippingNormsEqualOneProcess) {
  if (grids(ctx().world_size()).empty()) GTEST_SKIP() << "grids for 4 and 8 ranks";
  for (const Grid3& g : grids(ctx().world_size())) expect_steps_match(g);
}

TEST(ThreeD, LlamaStepsAndClippingNormsEqualOneProcess) {
  if (grids(ctx().world_size()).empty()) GTEST_SKIP() << "grids for 4 and 8 ranks";
  g_llama = true;
  for (const Grid3& g : grids(ctx().world_size())) expect_steps_match(g);
  g_llama = false;
}

// Every rank of a 3D grid takes the fp16 overflow of any one rank: the scaler skips the step everywhere.
TEST(ThreeD, OverflowOnOneRankSkipsTheStepEverywhere) {
  if (grids(ctx().world_size()).empty()) GTEST_SKIP() << "grids for 4 and 8 ranks";
  for (const Grid3& g : grids(ctx().world_size())) {
    SCOPED_TRACE(name(g));
    dist::Topology topo(ctx().world(), {g.dp, g.tp, g.pp}, "mpi");
    const train::TrainConfig cfg = train_config(g);
    train::ParallelModel m = train::build_model_and_sync(cfg, model_config(), topo, Device::cpu(), 0, {});
    // Only the highest rank of the world saw an inf: all of them must agree on it.
    const bool mine = topo.rank() == ctx().world_size() - 1;
    EXPECT_TRUE(m.sync->combine_overflow(mine));
    EXPECT_FALSE(m.sync->combine_overflow(false));
  }
}
