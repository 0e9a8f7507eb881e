// Tensor parallelism (dist/tensor_parallel.h's styles applied by dist/tp_plan.h's plan to an unmodified nn::GPT)
// against one process, at world sizes 2 and 4:
// - the split model starts from the one-process weights (gathered back, bit for bit: q/k/v re-interleaved, the
//   vocabulary padding dropped), and its forward equals the unsplit forward layer by layer within 1e-6 (f32),
//   its gradients too (each rank's slice of the one-process gradient; padded vocabulary rows get none);
// - training with SGD (momentum, clipping) equals one process within 1e-4 over 20 steps, at tp = world and at
//   tp 2 x dp 2 with dropout, block recomputation and gradient accumulation; the clipping norm counts replicated
//   parameters once;
// - a tp run saves one whole-model file that one process loads and evaluates to the same loss, and a tp run loads.
// The vocabulary is 65 throughout: not a multiple of 2 or 4, so the last rank holds padded rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include "core/rng.h"
#include "dist/topology.h"
#include "dist/tensor_parallel.h"
#include "dist/tp_plan.h"
#include "nn/checkpoint.h"
#include "optim/sgd.h"
#include "support/mpi_test.h"
#include "nn/param_layout.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/step.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 65, kSeq = 16;

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

nn::GPTConfig config(double dropout = 0.0) { return nn::GPTConfig{kVocab, kSeq, 2, 4, 32, dropout, true}; }

// A deterministic global batch of `rows` sequences for a step; every 7th target ignored (-1) when asked.
data::Batch global_batch(int step, int64_t rows, bool ignore_some = false) {
  std::vector<int32_t> x(size_t(rows * kSeq)), y(size_t(rows * kSeq));
  Philox rng(7, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = ignore_some && i % 7 == 3 ? -1 : int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {rows, kSeq}), Tensor::from_vector(y, {rows, kSeq})};
}

// One process's GPT, split over tp by GPT-2's plan: what a tensor-parallel rank trains.
std::unique_ptr<nn::GPT> split_gpt(dist::ProcessGroup& tp, bool sequence_parallel = false, double dropout = 0.0,
                                   uint64_t seed = 1337) {
  auto model = std::make_unique<nn::GPT>(config(dropout), seed);
  dist::apply_tensor_parallel(*model, tp, dist::gpt2_plan(sequence_parallel));
  return model;
}

// Collective over the group: every parameter whole (q, k, v back in their ranges, the vocabulary padding dropped).
nn::StateDict gathered(const nn::GPT& model) {
  nn::StateDict whole;
  for (auto& [name, t] : dist::gather_whole(model.parameters(), model.named_parameters())) whole[name] = t;
  return whole;
}

const dist::VocabParallel& vocab_style(const nn::GPT& model) {
  const auto* style = dynamic_cast<const dist::VocabParallel*>(model.wte->style.get());
  EXPECT_NE(style, nullptr) << "wte has no VocabParallel style";
  return *style;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  std::vector<double> u = a.to_vector(), v = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < u.size(); ++i) m = std::max(m, std::abs(u[i] - v[i]));
  return m;
}

}  // namespace

TEST(TensorParallel, StartsFromTheOneProcessWeightsAndComputesItsForwardAndGradients) {
  const int tp = ctx().world_size();
  dist::Topology topo(ctx().world(), {1, tp, 1}, "ring");
  nn::GPT one(config(), 1337);
  const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group());
  nn::GPT& split = *model;

  // Initialisation by global element index: the gathered split model is the one-process model, bit for bit.
  nn::StateDict whole = gathered(split), want = one.state_dict();
  ASSERT_EQ(whole.size(), want.size());
  for (const auto& [name, t] : want) EXPECT_EQ(whole.at(name).to_vector(), t.to_vector()) << name;
  EXPECT_EQ(whole.at("transformer.wte.weight").shape(), (Shape{kVocab, 32}));  // padding dropped
  EXPECT_DOUBLE_EQ(split.flops_per_token(kSeq), one.flops_per_token(kSeq));

  // Layer by layer, f32: embedding, each block, the whole logits, the loss (with ignored targets).
  data::Batch b = global_batch(0, 3, /*ignore_some=*/true);
  Tensor x1 = one.embed(b.x), x2 = split.embed(b.x);
  EXPECT_LE(max_abs_diff(x1, x2), 1e-6) << "embedding";
  for (int64_t i = 0; i < 2; ++i) {
    x1 = one.blocks(i, i + 1, x1);
    x2 = split.blocks(i, i + 1, x2);
    EXPECT_LE(max_abs_diff(x1, x2), 1e-6) << "block " << i;
  }
  Tensor logits = split.head(x2);
  EXPECT_EQ(logits.shape(), (Shape{3, kSeq, kVocab}));
  EXPECT_LE(max_abs_diff(one.head(x1), logits), 1e-6) << "logits";
  Tensor l1 = one.head_loss(x1, b.y), l2 = split.head_loss(x2, b.y);
  EXPECT_NEAR(l1.item(), l2.item(), 1e-6) << "loss";

  // Padded vocabulary rows are -inf logits on their rank: they never win a softmax.
  const dist::VocabParallel& wte = vocab_style(split);
  Tensor local = wte.local_logits(*split.wte, Tensor::ones({1, 32})).detach();
  std::vector<double> lv = local.to_vector();
  for (int64_t j = 0; j < wte.vocab_per_rank; ++j) {
    if (wte.vocab_start + j >= kVocab)
      EXPECT_TRUE(std::isinf(lv[size_t(j)]) && lv[size_t(j)] < 0) << "padded row " << wte.vocab_start + j;
    else
      EXPECT_TRUE(std::isfinite(lv[size_t(j)])) << "row " << wte.vocab_start + j;
  }

  // Gradients: each rank's slice of the one-process gradient (the pitfall of a q/k/v split along the wrong
  // boundaries shows here, in c_attn); padded rows of wte get exactly zero.
  l1.backward();
  l2.backward();
  const nn::NamedTensors one_params = one.named_parameters();
  for (const auto& [name, p] : split.named_parameters()) {
    Tensor g1;
    for (const auto& [n1, p1] : one_params)
      if (n1 == name) g1 = p1.grad();
    EXPECT_LE(max_abs_diff(nn::layout_of(p).slice(g1), p.grad()), 1e-6) << name;
  }
  std::vector<double> gw = split.wte->weight.grad().to_vector();
  for (int64_t j = 0; j < wte.vocab_per_rank; ++j)
    if (wte.vocab_start + j >= kVocab)
      for (int64_t c = 0; c < 32; ++c) EXPECT_EQ(gw[size_t(j * 32 + c)], 0.0) << "padded row " << wte.vocab_start + j;
}

namespace {

struct TrainRun {
  std::vector<double> losses, norms;
  nn::StateDict weights;
};

// SGD with momentum; tp = dp = 0: one process.
TrainRun train_run(int tp, int dp, double dropout, nn::Recompute recompute, int64_t grad_accum, double clip, int steps,
                   bool sequence_parallel = false) {
  const int64_t rows = 8;
  std::unique_ptr<dist::Topology> topo;
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<train::GradSync> sync;
  int dp_rank = 0;
  if (tp == 0) {
    model = std::make_unique<nn::GPT>(config(dropout), 1337);
  } else {
    topo = std::make_unique<dist::Topology>(ctx().world(), dist::Grid{dp, tp, 1}, "ring");
    model = split_gpt(topo->tp_group(), sequence_parallel, dropout);
    sync = std::make_unique<train::GradSync>(train::Stage::of(*model), *topo);  // DDP over dp when dp > 1
    dp_rank = topo->coord().dp;
  }
  const int64_t per_rank = rows / std::max(dp, 1);
  model->train();
  model->set_recompute(recompute);
  model->dropout_context().first_sample = dp_rank * per_rank;
  optim::SGD opt(optim::decay_groups(model->named_parameters(), 0.0), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  train::StepOptions o;
  o.lr = 0.1;
  o.grad_clip = clip;
  o.micro_batches = grad_accum;
  o.grad_sync = sync ? sync.get() : &train::GradSync::one_process();
  TrainRun r;
  for (int s = 0; s < steps; ++s) {
    data::Batch g = global_batch(s, rows);
    data::Batch mine{g.x.narrow(0, dp_rank * per_rank, per_rank), g.y.narrow(0, dp_rank * per_rank, per_rank)};
    train::StepResult step = train::train_step(*model, opt, mine, o);
    r.losses.push_back(dp > 1 ? train::sum_over(topo->dp_group(), step.loss) / dp : step.loss);
    r.norms.push_back(step.grad_norm);
  }
  r.weights = tp > 0 ? gathered(*model) : model->state_dict();
  return r;
}

void expect_close(const TrainRun& a, const TrainRun& b, double tol) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_NEAR(a.losses[s], b.losses[s], tol * std::abs(b.losses[s])) << "loss, step " << s;
    EXPECT_NEAR(a.norms[s], b.norms[s], tol * std::abs(b.norms[s])) << "gradient norm, step " << s;
  }
  for (const auto& [name, w] : b.weights) EXPECT_LE(max_abs_diff(a.weights.at(name), w), tol) << name;
}

}  // namespace

// Clipping at 0.5 is active in the early steps: a norm that counted the replicated parameters (LayerNorms, wpe,
// row-parallel biases) tp times would clip differently and drift.
// Generation on a tensor-parallel split (every rank of the group calls it): with the KV cache (each rank keeping
// its own heads' keys and values) the same tokens as with the window recomputed, greedy and sampled, through a
// window that fills and slides (block 16, 40 new tokens); and the one-process model's greedy tokens. A
// sequence-parallel split recomputes the window (the cache needs the whole sequence on every rank).
TEST(TensorParallel, KvCachedGenerationEqualsRecomputedAndOneProcess) {
  const int tp = ctx().world_size();
  dist::Topology topo(ctx().world(), {1, tp, 1}, "ring");
  const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group());
  nn::GPT& split = *model;
  EXPECT_TRUE(split.supports_kv_cache());
  nn::GPT one(config(), 1337);
  const std::vector<int32_t> prompt{5, 17, 42};
  for (double temperature : {0.0, 0.9}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    train::GenerateOptions o;
    o.max_new_tokens = 40;
    o.temperature = temperature;
    o.top_k = temperature > 0 ? 8 : 0;
    o.seed = 3;
    const std::vector<int32_t> cached = train::generate(split, prompt, o);
    o.kv_cache = false;
    EXPECT_EQ(cached, train::generate(split, prompt, o));
    if (temperature == 0) EXPECT_EQ(cached, train::generate(one, prompt, o));
  }
  EXPECT_EQ(split_gpt(topo.tp_group(), /*sequence_parallel=*/true)->supports_kv_cache(), tp == 1);
}

TEST(TensorParallel, SgdEqualsOneProcess) {
  const int world = ctx().world_size();
  const TrainRun one = train_run(0, 0, 0.0, nn::Recompute::kNone, 1, 0.5, 20);
  SCOPED_TRACE("tp " + std::to_string(world));
  expect_close(train_run(world, 1, 0.0, nn::Recompute::kNone, 1, 0.5, 20), one, 1e-4);
}

// tp 2 x dp 2 (world 4; at world 2: tp 2) with dropout 0.1 (masks keyed by the global sample, the same on the
// ranks of a tp group), block recomputation (its recomputed forward repeats the all-reduces inside backward) and 2
// micro-batches.
TEST(TensorParallel, ComposesWithDataParallelDropoutRecomputeAndAccumulation) {
  const int world = ctx().world_size();
  const int dp = world / 2;
  const TrainRun one = train_run(0, 0, 0.1, nn::Recompute::kNone, 1, 0.5, 20);
  SCOPED_TRACE("tp 2 x dp " + std::to_string(dp));
  expect_close(train_run(2, dp, 0.1, nn::Recompute::kBlock, 2, 0.5, 20), one, 1e-4);
}

// Checkpoint: a tp run writes one Hugging Face GPT-2 file; one process loads it (strict names and shapes: the
// padded vocabulary rows are not in it) and computes the tp model's loss; a tp model loads it back exactly.
TEST(TensorParallel, SavesOneWholeModelFileThatOneProcessLoads) {
  const int tp = ctx().world_size();
  dist::Topology topo(ctx().world(), {1, tp, 1}, "ring");
  const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group());
  nn::GPT& split = *model;
  optim::SGD opt(optim::decay_groups(split.named_parameters(), 0.0), optim::SGDOptions{.lr = 0.1});
  train::GradSync sync(train::Stage::of(split), topo);
  train::StepOptions o;
  o.lr = 0.5;
  o.grad_sync = &sync;
  for (int s = 0; s < 3; ++s) train::train_step(split, opt, global_batch(s, 4), o);  // move off the initial weights

  // A directory of its own (save_gpt writes config.json beside the file); the ranks share their launcher's pid.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("minidl_test_tp_" + std::to_string(tp) + "_" + std::to_string(getppid()));
  if (topo.tp_group().rank() == 0) std::filesystem::create_directories(dir);
  topo.tp_group().barrier()->wait();
  const std::string path = (dir / "model.safetensors").string();
  {  // what a training run saves (train::consolidated_model: every tp rank joins the gather, rank 0 writes)
    const bool leader = topo.tp_group().rank() == 0;
    const std::shared_ptr<nn::GPT> whole = train::consolidated_model(train::Stage::of(split), leader);
    if (leader) nn::save_gpt(path, *whole, "[]", {});
  }
  topo.tp_group().barrier()->wait();

  data::Batch val = global_batch(100, 4);
  split.eval();
  const double tp_loss = split.loss(val.x, val.y).item();
  nn::GPT one(config(), 1);
  nn::load_into(one, path);
  one.eval();
  EXPECT_NEAR(one.loss(val.x, val.y).item(), tp_loss, 1e-6);

  const std::unique_ptr<nn::GPT> again = split_gpt(topo.tp_group(), false, 0.0, /*seed=*/2);
  train::Stage again_stage = train::Stage::of(*again);
  train::load_model(again_stage, path);  // each rank's slices, as its parameters' layouts say
  for (const auto& [name, p] : again->named_parameters()) {
    Tensor q;
    for (const auto& [n, t] : split.named_parameters())
      if (n == name) q = t;
    EXPECT_EQ(p.to_vector(), q.to_vector()) << name;
  }
  topo.tp_group().barrier()->wait();
  if (topo.tp_group().rank() == 0) std::filesystem::remove_all(dir);
}

// Sequence parallelism: the loss and every gradient of one process (the replicated parameters' only after
// GradSync all-reduces their partial sums: leaving LayerNorm gradients unreduced is the classic bug, and
// fails here), and SGD training with dropout (per-position masks of one process), block recomputation, clipping
// and, at world 4, tp 2 x dp 2 with accumulation.
TEST(TensorParallel, SequenceParallelEqualsOneProcess) {
  const int world = ctx().world_size();
  {
    dist::Topology topo(ctx().world(), {1, world, 1}, "ring");
    nn::GPT one(config(), 1337);
    const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group(), /*sequence_parallel=*/true);
    nn::GPT& split = *model;
    train::GradSync sync(train::Stage::of(split), topo);
    data::Batch b = global_batch(0, 3, /*ignore_some=*/true);
    Tensor x = split.embed(b.x);
    EXPECT_EQ(x.shape(), (Shape{3, kSeq / world, 32}));
    EXPECT_LE(max_abs_diff(split.head(split.blocks(0, 2, x)), one.forward(b.x)), 1e-6) << "logits";
    Tensor l1 = one.loss(b.x, b.y), l2 = split.loss(b.x, b.y);
    EXPECT_NEAR(l1.item(), l2.item(), 1e-6);
    l1.backward();
    sync.before_backward(0, true);
    l2.backward();
    sync.after_backward();
    const nn::NamedTensors one_params = one.named_parameters();
    size_t compared = 0;  // every parameter of the split model has its whole counterpart
    for (const auto& [name, p] : split.named_parameters())
      for (const auto& [n1, p1] : one_params)
        if (n1 == name) {
          EXPECT_LE(max_abs_diff(nn::layout_of(p).slice(p1.grad()), p.grad()), 1e-6) << name;
          ++compared;
        }
    EXPECT_EQ(compared, split.named_parameters().size());
  }
  const TrainRun one = train_run(0, 0, 0.1, nn::Recompute::kNone, 1, 0.5, 20);
  expect_close(train_run(world, 1, 0.1, nn::Recompute::kBlock, 1, 0.5, 20, true), one, 1e-4);
  if (world == 4) {
    SCOPED_TRACE("tp 2 x dp 2, sequence parallel");
    expect_close(train_run(2, 2, 0.1, nn::Recompute::kNone, 2, 0.5, 20, true), one, 1e-4);
  }
}

// What one training forward + backward moves (dist::tensor_parallel_traffic), against the arithmetic of
// docs/parallelism.md, "Tensor parallelism": L blocks, N = B·T tokens, C = n_embd, f32.
//   tp:  all-reduces of (4L + 2)·N·C (two forward and two backward per block, the embedding's g, the head's f)
//        plus 3·N for the loss (row max, sum of exponentials, target logit);
//   sp:  all-gathers of (6L + 2)·N·C (per block: two before the column-parallel layers, again in backward, and the
//        backward of the two reduce-scatters; the head's gather; the embedding's backward), reduce-scatters of
//        (4L + 2)·N·C, all-reduces of 3·N and of the replicated parameters' gradients.
TEST(TensorParallel, TrafficMatchesTheFormula) {
  const int world = ctx().world_size();
  dist::Topology topo(ctx().world(), {1, world, 1}, "ring");
  const int64_t L = 2, B = 3, C = 32, N = B * kSeq;
  data::Batch b = global_batch(0, B);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group(), sp);
    nn::GPT& split = *model;
    train::GradSync sync(train::Stage::of(split), topo);
    int64_t replicated = 0;
    for (const Tensor& p : split.parameters())
      if (nn::layout_of(p).is_replicated()) replicated += p.numel();
    dist::reset_tensor_parallel_traffic();
    sync.before_backward(0, true);
    split.loss(b.x, b.y).backward();
    sync.after_backward();
    const dist::TensorParallelTraffic t = dist::tensor_parallel_traffic();
    if (!sp) {
      EXPECT_EQ(t.all_reduce_bytes, 4 * ((4 * L + 2) * N * C + 3 * N));
      EXPECT_EQ(t.all_gather_bytes, 0);
      EXPECT_EQ(t.reduce_scatter_bytes, 0);
    } else {
      EXPECT_EQ(t.all_reduce_bytes, 4 * (3 * N + replicated));
      EXPECT_EQ(t.all_gather_bytes, 4 * (6 * L + 2) * N * C);
      EXPECT_EQ(t.reduce_scatter_bytes, 4 * (4 * L + 2) * N * C);
    }
  }
}

// The plan against the model it splits: every parameter ends with a layout naming the group (split by a row, or
// replicated), the split ones being exactly GPT-2's matrices, column-parallel biases and wte; a row that names
// nothing in a whole model, or a module of the wrong kind, is refused by name; a group of one changes nothing.
TEST(TensorParallel, PlanSplitsExactlyItsModulesAndAGroupOfOneChangesNothing) {
  const int world = ctx().world_size();
  dist::Topology topo(ctx().world(), {1, world, 1}, "ring");
  const std::unique_ptr<nn::GPT> model = split_gpt(topo.tp_group());
  int64_t split = 0, replicated = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const nn::ParamLayout l = nn::layout_of(p);
    EXPECT_EQ(l.group, &topo.tp_group()) << name;
    split += l.is_split();
    replicated += l.is_replicated();
    EXPECT_FALSE(l.sequence_sliced) << name;
  }
  EXPECT_EQ(split, 1 + 2 * (4 + 2)) << "wte, and per block 4 matrices and the c_attn and c_fc biases";
  EXPECT_EQ(replicated, 3 + 2 * 6) << "wpe, ln_f (2), and per block 2 LayerNorms (4) and the 2 row-parallel biases";

  dist::TensorParallelPlan typo = dist::gpt2_plan(false);
  typo.push_back({"transformer.h.*.mlp.c_fcc", {dist::ParallelStyle::kColwise}});
  nn::GPT a(config(), 1337);
  try {
    dist::apply_tensor_parallel(a, topo.tp_group(), typo);
    ADD_FAILURE() << "a plan row naming nothing was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.*.mlp.c_fcc"), std::string::npos) << e.what();
  }
  nn::GPT b(config(), 1337);
  try {
    dist::apply_tensor_parallel(b, topo.tp_group(), {{"transformer.h.0.ln_1", {dist::ParallelStyle::kColwise}}});
    ADD_FAILURE() << "a LayerNorm was split as a Linear";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("is not a Linear"), std::string::npos) << e.what(); }

  dist::Topology alone(ctx().world(), {world, 1, 1}, "ring");  // tp groups of one
  nn::GPT c(config(), 1337), one(config(), 1337);
  dist::apply_tensor_parallel(c, alone.tp_group(), dist::gpt2_plan(true));
  const nn::NamedTensors want = one.named_parameters();
  const nn::NamedTensors got = c.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector()) << got[i].first;
    EXPECT_EQ(nn::layout_of(got[i].second).group, nullptr) << got[i].first;
  }
  EXPECT_EQ(c.wte->style, nullptr);
  data::Batch batch = global_batch(0, 2);
  EXPECT_EQ(c.loss(batch.x, batch.y).item(), one.loss(batch.x, batch.y).item());
}
