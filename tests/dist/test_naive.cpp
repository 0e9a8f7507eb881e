// The teaching tier (dist/naive/) against what production or one process computes, at 2 and 3 ranks. Each rank
// initialises its model from its own seed, so the start-up broadcast is part of what is compared.
// - naive DDP = dist::DistributedDataParallel, bitwise at 2 ranks, within 1e-5 at 3; = one process within 1e-4
//   (one process's GEMMs sum over the whole batch, in another order than the per-rank GEMMs and the average);
// - naive overlapped DDP = naive DDP at bucket caps giving 1 bucket, several and one tensor each (same tolerances);
// - naive ZeRO-1 + AdamW = production DDP + AdamW with one bucket laid out like the naive flat vector, over "ring",
//   bitwise at every size (the ring's all-reduce is its reduce-scatter plus all-gather of the same chunks, and AdamW
//   is elementwise); = production ZeRO-1 bitwise at 2 ranks;
// - naive ZeRO-3 = production dist::ZeroStage3, bitwise at 2 ranks, within 1e-5 at 3; blocks are freed after their
//   forward and backward;
// - naive tensor-parallel MLP and attention = the unsplit nn::MLP / nn::CausalSelfAttention within 1e-5 (below);
// - naive GPipe (2 and 3 stages) = production's GPipe executor, the loss and every gradient bitwise, wte included;
//   = one process accumulating the same 4 micro-batches, bitwise but the tied wte's (its embedding and head halves
//   are summed in another order), within 1e-6;
// - naive 1F1B (2 and 3 stages) = production's 1F1B executor, bitwise; both pipelines' activation peaks within 10%
//   of production's (each rank builds only its stage);
// - naive expert parallelism = the whole nn::MoE on each rank's tokens, and production's exchange
// (dist/expert_parallel.h)
//   the same, its off-rank rows counted exactly, within 1e-6 (1e-5 for the experts' summed gradients);
// - the naive GPipe and 1F1B action lists pass production's validator, in production's compute order, with its
//   simulated bubble and micro-batches in flight (2 to 4 stages, 1 to 8 micro-batches).
// Bitwise at 2 ranks, whatever the layout: a sum of two floats does not depend on their order, and the average
// divides it by 2 exactly. At 3 ranks a ring adds an element's three terms in an order set by which chunk holds it,
// and naive DDP and ZeRO-3 cut their buffers (per parameter, per block) differently from production's buckets.
// The comparisons within a tolerance train with SGD: AdamW divides by the gradient's own magnitude, which turns
// rounding noise in gradients that are zero in exact arithmetic (the attention key bias) into full-size updates.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/memory.h"
#include "core/rng.h"
#include "dist/ddp.h"
#include "dist/expert_parallel.h"
#include "dist/naive/ddp.h"
#include "dist/naive/ddp_overlap.h"
#include "dist/naive/gpipe.h"
#include "dist/naive/moe.h"
#include "dist/naive/one_f_one_b.h"
#include "dist/naive/tensor_parallel.h"
#include "dist/naive/zero1.h"
#include "dist/naive/zero3.h"
#include "dist/pipeline.h"
#include "dist/process_group.h"
#include "dist/topology.h"
#include "dist/tp_plan.h"
#include "dist/zero.h"
#include "dist/zero3.h"
#include "nn/gpt.h"
#include "nn/moe.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "support/mpi_test.h"
#include "train/grad_sync.h"
#include "train/stage.h"
#include "train/step.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8, kGlobalBatch = 24;

const dist::Context& ctx() { return minidl::testing::mpi_context(); }
nn::GPTConfig tiny(int64_t layers = 2) { return nn::GPTConfig{kVocab, kSeq, layers, 2, 16, 0.0, true}; }

std::pair<Tensor, Tensor> global_batch(int step, int64_t rows = kGlobalBatch) {
  std::vector<int32_t> x(rows * kSeq), y(rows * kSeq);
  Philox rng(99, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {rows, kSeq}), Tensor::from_vector(y, {rows, kSeq})};
}

// Naive ZeRO-3 keeps a block whole only while it runs: between a pass's blocks, only the shards hold memory.
void expect_blocks_released(const nn::GPT& model, const char* when) {
  for (int64_t i = 0; i < model.config().n_layer; ++i)
    EXPECT_EQ(model.block_parameters(i)[0].impl()->storage->data(), nullptr) << "block " << i << " whole " << when;
}

enum class Mode {
  kOneProcess,
  kNaiveDDP,
  kNaiveDDPOverlap,
  kDDP,
  kDDPOneBucket,
  kNaiveZero1,
  kZero1,
  kNaiveZero3,
  kZero3
};

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<double>> weights;
};

// `steps` steps of AdamW (adamw) or SGD with momentum on the global batch, each rank taking its slice.
RunResult train_with(Mode mode, bool adamw, int steps = 8, int64_t bucket_cap = 0) {
  auto pg = dist::make_process_group("ring", ctx().world());
  const bool one = mode == Mode::kOneProcess;
  const int n = one ? 1 : pg->size(), rank = one ? 0 : pg->rank();
  nn::GPT model(tiny(), 1337 + uint64_t(rank));  // each rank's own init: the broadcast must replace it
  auto groups = optim::decay_groups(model.named_parameters(), adamw ? 0.1 : 0.0);
  std::unique_ptr<dist::naive::DataParallel> naive_ddp;
  std::unique_ptr<dist::naive::OverlappedDataParallel> overlapped;
  std::unique_ptr<dist::naive::Zero1AdamW> naive_zero1;
  std::unique_ptr<dist::naive::Zero3> naive_zero3;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ZeroDataParallel> zero1;
  std::unique_ptr<dist::ZeroStage3> zero3;
  if (mode == Mode::kNaiveDDP) naive_ddp = std::make_unique<dist::naive::DataParallel>(model, *pg);
  if (mode == Mode::kNaiveDDPOverlap)
    overlapped = std::make_unique<dist::naive::OverlappedDataParallel>(model, *pg, bucket_cap);
  if (mode == Mode::kDDP) ddp = std::make_unique<dist::DistributedDataParallel>(model, *pg);
  if (mode == Mode::kDDPOneBucket) {  // one bucket, the parameters in the naive ZeRO-1's flat order (group order)
    const auto named = model.named_parameters();
    dist::BucketSpec bucket{DType::f32, {}, {}, 0};
    for (const optim::ParamGroup& g : groups)
      for (const Tensor& p : g.params)
        for (size_t i = 0; i < named.size(); ++i)
          if (named[i].second.impl() == p.impl()) {
            bucket.params.push_back(i);
            bucket.offsets.push_back(bucket.numel);
            bucket.numel += p.numel();
          }
    ddp = std::make_unique<dist::DistributedDataParallel>(model, *pg, dist::DDPOptions{.buckets = {bucket}});
  }
  if (mode == Mode::kNaiveZero1)
    naive_zero1 = std::make_unique<dist::naive::Zero1AdamW>(model, *pg, groups, optim::AdamWOptions{.lr = 1e-2});
  if (mode == Mode::kZero1) {
    zero1 = std::make_unique<dist::ZeroDataParallel>(model, *pg);
    groups = zero1->shard_groups(groups);
  }
  if (mode == Mode::kNaiveZero3) {
    naive_zero3 = std::make_unique<dist::naive::Zero3>(model, *pg);
    groups = {{naive_zero3->parameters(), 0.0}};
  }
  if (mode == Mode::kZero3) {
    zero3 = std::make_unique<dist::ZeroStage3>(model, *pg);
    groups = zero3->shard_groups(groups);
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (adamw && !naive_zero1) opt = std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2});
  if (!adamw) opt = std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  const int64_t rows = kGlobalBatch / n;
  RunResult run;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(s);
    Tensor loss = model.loss(x.narrow(0, rank * rows, rows), y.narrow(0, rank * rows, rows));
    if (naive_zero3) expect_blocks_released(model, "after the forward");
    loss.backward();
    if (naive_ddp) naive_ddp->average_gradients();
    if (overlapped) overlapped->finish();
    Tensor l = Tensor::scalar(loss.item());
    if (!one) pg->all_reduce(l, dist::ReduceOp::kAvg)->wait();
    run.losses.push_back(l.item());
    if (naive_zero1) {
      naive_zero1->step();
      continue;
    }
    opt->step();
    opt->zero_grad();
    if (zero1) zero1->gather_parameters();
    if (zero3) zero3->gather_parameters();
  }
  if (zero3) zero3->hold_full(true);
  if (naive_zero3) {
    expect_blocks_released(model, "after the backward");
    for (int64_t i = 0; i < 2; ++i) naive_zero3->gather(i);
  }
  for (const Tensor& p : model.parameters()) run.weights.push_back(p.to_vector());
  return run;
}

void expect_bitwise(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_EQ(a.weights[i], b.weights[i]) << "parameter " << i;
}

void expect_close(const RunResult& a, const RunResult& b, double rel) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_NEAR(a.losses[s], b.losses[s], rel * b.losses[s]) << "step " << s;
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i)
    for (size_t j = 0; j < a.weights[i].size(); ++j)
      ASSERT_NEAR(a.weights[i][j], b.weights[i][j], rel * std::max(1.0, std::abs(b.weights[i][j])))
          << "parameter " << i << " element " << j;
}

// Bitwise at 2 ranks; at more, within `rel` (the summation order of a parameter's terms differs, see the top).
void expect_equal_at_two(const RunResult& a, const RunResult& b, double rel) {
  if (ctx().world_size() <= 2)
    expect_bitwise(a, b);
  else
    expect_close(a, b, rel);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> u = a.to_vector(), v = b.to_vector();
  double m = u.size() == v.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(u.size(), v.size()); ++i) m = std::max(m, std::abs(u[i] - v[i]));
  return m;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, double scale) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<float> v(static_cast<size_t>(numel));
  Philox rng(seed, 0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(scale) * rng.normal(i);
  return Tensor::from_vector(v, shape);
}

}  // namespace

TEST(Naive, DDPEqualsProductionDDPAndOneProcess) {
  const RunResult naive = train_with(Mode::kNaiveDDP, false);
  expect_equal_at_two(naive, train_with(Mode::kDDP, false), 1e-5);
  expect_close(naive, train_with(Mode::kOneProcess, false), 1e-4);
}

// Overlapped DDP averages the same gradients in buckets: equal to naive DDP (bitwise at 2 ranks; at 3 a ring adds
// an element's terms in an order set by its place in the buffer, and the buckets place it elsewhere) at bucket caps
// giving one bucket, a few, and one tensor each.
TEST(Naive, OverlappedDDPEqualsNaiveDDPAtEveryBucketCap) {
  const RunResult naive = train_with(Mode::kNaiveDDP, false);
  for (int64_t cap : {int64_t(1) << 40, int64_t(2000), int64_t(1)}) {
    SCOPED_TRACE(::testing::Message() << "bucket cap " << cap);
    expect_equal_at_two(train_with(Mode::kNaiveDDPOverlap, false, 8, cap), naive, 1e-5);
  }
}

TEST(Naive, Zero1EqualsDDPWithAdamWBitwise) {
  const RunResult naive = train_with(Mode::kNaiveZero1, true);
  expect_bitwise(naive, train_with(Mode::kDDPOneBucket, true));
  if (ctx().world_size() <= 2) expect_bitwise(naive, train_with(Mode::kZero1, true));
}

TEST(Naive, Zero3EqualsProductionZero3) {
  const RunResult naive = train_with(Mode::kNaiveZero3, false);
  expect_equal_at_two(naive, train_with(Mode::kZero3, false), 1e-5);
  expect_close(naive, train_with(Mode::kOneProcess, false), 1e-4);
}

// The split layers against the whole ones: forward, the input's gradient, and each weight slice's gradient. Within
// 1e-5, not bitwise: the row-parallel layer sums its N partial products through the all-reduce, where the whole
// layer's GEMM sums the same products inside one dot product, in another order.
TEST(Naive, TensorParallelMLPAndAttentionEqualTheWholeLayers) {
  auto pg = dist::make_process_group("ring", ctx().world());
  const int n = pg->size(), r = pg->rank();
  const nn::GPTConfig cfg{kVocab, kSeq, 1, 6, 12, 0.0, true};  // 6 heads, 48 hidden units: split 1, 2 or 3 ways
  auto dropout = std::make_shared<nn::DropoutContext>();
  nn::MLP mlp(cfg, 0, dropout);
  nn::CausalSelfAttention attn(cfg, 1, dropout);
  uint64_t seed = 1;
  for (nn::Module* m : {static_cast<nn::Module*>(&mlp), static_cast<nn::Module*>(&attn)})
    for (auto [name, p] : m->named_parameters()) p.copy_(random_tensor(p.shape(), seed++, 0.3));
  const Tensor x = random_tensor({2, kSeq, 12}, 100, 1.0), dy = random_tensor({2, kSeq, 12}, 101, 1.0);
  const int64_t C = 12, c = C / n, h = 4 * C / n;
  // The whole layer's gradient that split parameter `part` must equal: its columns or rows of the whole one.
  auto cut = [](const Tensor& whole_grad, int dim, int64_t begin, int64_t len) {
    return whole_grad.narrow(dim, begin, len);
  };
  auto qkv_cut = [&](const Tensor& whole_grad, int dim) {  // this rank's columns of q, of k and of v, side by side
    Shape shape = whole_grad.shape();
    shape[size_t(dim)] = 3 * c;
    Tensor out = Tensor::empty(shape);
    for (int64_t j = 0; j < 3; ++j) out.narrow(dim, j * c, c).copy_(whole_grad.narrow(dim, j * C + r * c, c));
    return out;
  };
  auto check = [&](const char* what, const std::function<Tensor(const Tensor&)>& whole,
                   const std::function<Tensor(const Tensor&)>& split,
                   const std::function<std::vector<std::pair<Tensor, Tensor>>()>& slices) {
    SCOPED_TRACE(what);
    Tensor x1 = x.clone().set_requires_grad(true), x2 = x.clone().set_requires_grad(true);
    Tensor y1 = whole(x1), y2 = split(x2);
    sum(mul(y1, dy)).backward();
    sum(mul(y2, dy)).backward();
    EXPECT_LE(max_abs_diff(y1, y2), 1e-5) << "forward";
    EXPECT_LE(max_abs_diff(x1.grad(), x2.grad()), 1e-5) << "input gradient";
    int i = 0;
    for (const auto& [part, of_whole] : slices())
      EXPECT_LE(max_abs_diff(part.grad(), of_whole), 1e-5) << "weight " << i++;
  };
  dist::naive::ParallelMLP pmlp(mlp, *pg);
  check(
      "MLP", [&](const Tensor& in) { return mlp.forward(in); }, [&](const Tensor& in) { return pmlp.forward(in); },
      [&]() -> std::vector<std::pair<Tensor, Tensor>> {
        return {{pmlp.fc_weight, cut(mlp.c_fc->weight.grad(), 1, r * h, h)},
                {pmlp.fc_bias, cut(mlp.c_fc->bias.grad(), 0, r * h, h)},
                {pmlp.proj_weight, cut(mlp.c_proj->weight.grad(), 0, r * h, h)},
                {pmlp.proj_bias, mlp.c_proj->bias.grad()}};
      });
  dist::naive::ParallelAttention pattn(attn, *pg);
  check(
      "attention", [&](const Tensor& in) { return attn.forward(in); },
      [&](const Tensor& in) { return pattn.forward(in); },
      [&]() -> std::vector<std::pair<Tensor, Tensor>> {
        return {{pattn.attn_weight, qkv_cut(attn.c_attn->weight.grad(), 1)},
                {pattn.attn_bias, qkv_cut(attn.c_attn->bias.grad(), 0)},
                {pattn.proj_weight, cut(attn.c_proj->weight.grad(), 0, r * c, c)},
                {pattn.proj_bias, attn.c_proj->bias.grad()}};
      });
}

// The naive layers against production tensor parallelism (dist/tp_plan.h's plan applied to a GPT built from the
// same seed): forward, the input's gradient and every weight slice's gradient, bitwise, since both compute the
// same products and all-reduce them over the same backend; only the code that places the slices differs.
// Naive expert parallelism (6 experts over 2 or 3 ranks, k 2, with and without a capacity that drops) against the
// whole nn::MoE on each rank's own tokens: the output and the input's and router's gradients are the rank's own;
// a local expert's gradient is the sum over the ranks of the whole layer's (every rank's tokens routed to it).
TEST(Naive, ExpertParallelMoEEqualsTheWholeLayer) {
  for (const std::string backend : {"mpi", "ring"}) {
    auto pg = dist::make_process_group(backend, ctx().world());
    for (double capacity : {0.0, 0.7}) {
      SCOPED_TRACE(backend + " capacity " + std::to_string(capacity));
      nn::GPTConfig cfg{kVocab, kSeq, 1, 2, 12, 0.0, false};
      cfg.arch = nn::GPTConfig::Arch::kLlama;
      cfg.intermediate_size = 10;
      cfg.moe_experts = 6;
      cfg.moe_top_k = 2;
      cfg.moe_balance = nn::GPTConfig::Balance::kNone;
      cfg.moe_capacity = capacity;
      auto dropout = std::make_shared<nn::DropoutContext>();
      nn::MoE whole(cfg, 0, dropout, nullptr), spread(cfg, 0, dropout, nullptr);
      uint64_t seed = 1;
      for (auto [name, p] : whole.named_parameters()) p.copy_(random_tensor(p.shape(), seed++, 0.3));
      for (auto [name, p] : spread.named_parameters()) p.copy_(whole.state_dict().at(name));
      dist::naive::ExpertParallelMoE ep(spread, *pg);
      // Production's exchange (dist/expert_parallel.h) on a third copy: this rank's experts and the style.
      nn::MoE prod(cfg, 0, dropout, nullptr);
      for (auto [name, p] : prod.named_parameters()) p.copy_(whole.state_dict().at(name));
      auto style = std::make_shared<dist::ExpertParallel>(*pg, 6);
      prod.keep_experts(style->first(), style->per_rank());
      prod.style = style;
      Tensor x = random_tensor({2, kSeq, 12}, 200 + uint64_t(pg->rank()), 1.0), x2 = x.detach().clone();
      x.set_requires_grad(true);
      x2.set_requires_grad(true);
      const Tensor dy = random_tensor({2, kSeq, 12}, 300 + uint64_t(pg->rank()), 1.0);
      Tensor x3 = x.detach().clone();
      x3.set_requires_grad(true);
      const Tensor want = whole.forward(x), got = ep.forward(x2), production = prod.forward(x3);
      EXPECT_LE(max_abs_diff(got, want), 1e-6) << "output";
      EXPECT_LE(max_abs_diff(production, want), 1e-6) << "production's output";
      // The traffic's unit: the kept slots whose expert another rank holds, counted from the routing.
      int64_t off_rank = 0;
      const nn::Routing& routing = whole.last_routing();
      for (size_t slot = 0; slot < routing.row.size(); ++slot)
        off_rank += routing.row[slot] >= 0 && routing.expert[slot] / style->per_rank() != pg->rank();
      EXPECT_EQ(style->rows_sent(), off_rank);
      sum(want * dy).backward();
      sum(got * dy).backward();
      sum(production * dy).backward();
      EXPECT_LE(max_abs_diff(x3.grad(), x.grad()), 1e-6) << "production's input gradient";
      EXPECT_LE(max_abs_diff(x2.grad(), x.grad()), 1e-6) << "input gradient";
      EXPECT_LE(max_abs_diff(spread.router->weight.grad(), whole.router->weight.grad()), 1e-6) << "router gradient";
      for (int64_t e = 0; e < 6; ++e) {  // every rank all-reduces every expert's, in the same order
        Tensor all = (*whole.experts)[size_t(e)].up_proj->weight.grad().clone();
        pg->all_reduce(all, dist::ReduceOp::kSum)->wait();
        if (e >= ep.first() && e < ep.first() + ep.per_rank()) {
          EXPECT_LE(max_abs_diff((*spread.experts)[size_t(e)].up_proj->weight.grad(), all), 1e-5)
              << "local expert " << e << "'s gradient";
          EXPECT_LE(max_abs_diff(prod.expert(e).up_proj->weight.grad(), all), 1e-5) << "production's expert " << e;
        }
      }
    }
  }
}

TEST(Naive, TensorParallelEqualsProductionBitwise) {
  auto pg = dist::make_process_group("ring", ctx().world());
  const nn::GPTConfig cfg{kVocab, kSeq, 1, 6, 12, 0.0, true};
  nn::GPT whole(cfg, 5), prod(cfg, 5);
  dist::apply_tensor_parallel(prod, *pg, dist::gpt2_plan(false));
  const nn::Block &w = whole.block<nn::Block>(0), &p = prod.block<nn::Block>(0);
  const Tensor x = random_tensor({2, kSeq, 12}, 100, 1.0), dy = random_tensor({2, kSeq, 12}, 101, 1.0);
  auto bitwise = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.to_vector() == b.to_vector();
  };
  auto check = [&](const char* what, const std::function<Tensor(const Tensor&)>& naive,
                   const std::function<Tensor(const Tensor&)>& production,
                   const std::vector<std::pair<Tensor, Tensor>>& weights) {
    SCOPED_TRACE(what);
    Tensor x1 = x.clone().set_requires_grad(true), x2 = x.clone().set_requires_grad(true);
    Tensor y1 = naive(x1), y2 = production(x2);
    sum(mul(y1, dy)).backward();
    sum(mul(y2, dy)).backward();
    EXPECT_TRUE(bitwise(y1, y2)) << "forward, max |diff| " << max_abs_diff(y1, y2);
    EXPECT_TRUE(bitwise(x1.grad(), x2.grad())) << "input gradient";
    int i = 0;
    for (const auto& [mine, theirs] : weights) {
      EXPECT_TRUE(bitwise(mine.detach(), theirs.detach())) << "weight " << i << " starts from another slice";
      EXPECT_TRUE(bitwise(mine.grad(), theirs.grad())) << "weight " << i << "'s gradient";
      ++i;
    }
  };
  dist::naive::ParallelMLP mlp(*w.mlp, *pg);
  check(
      "MLP", [&](const Tensor& in) { return mlp.forward(in); }, [&](const Tensor& in) { return p.mlp->forward(in); },
      {{mlp.fc_weight, p.mlp->c_fc->weight},
       {mlp.fc_bias, p.mlp->c_fc->bias},
       {mlp.proj_weight, p.mlp->c_proj->weight},
       {mlp.proj_bias, p.mlp->c_proj->bias}});
  dist::naive::ParallelAttention attn(*w.attn, *pg);
  check(
      "attention", [&](const Tensor& in) { return attn.forward(in); },
      [&](const Tensor& in) { return p.attn->forward(in); },
      {{attn.attn_weight, p.attn->c_attn->weight},
       {attn.attn_bias, p.attn->c_attn->bias},
       {attn.proj_weight, p.attn->c_proj->weight},
       {attn.proj_bias, p.attn->c_proj->bias}});
}

namespace {

// Pipelines of S stages (the world), 2 blocks each, over M = 4 micro-batches of 2 sequences, dropout on: every rank
// builds only its stage's part of the model (nn::GPTStage), naive or production alike.
constexpr int kMicroBatches = 4;
constexpr int64_t kMicroRows = 2;
nn::GPTConfig piped(int stages) { return nn::GPTConfig{kVocab, kSeq, 2 * int64_t(stages), 2, 16, 0.1, true}; }

enum class Pipe { kNaiveGPipe, kNaive1F1B, kGPipe, k1F1B, kOneProcess };

// One step's forward and backward on this rank.
struct PipeStep {
  double loss = 0;  // the batch's loss, on the last stage (and one process)
  std::vector<std::pair<std::string, std::vector<double>>> grads;  // whole-model names
  double activation_peak = 0;  // bytes of activations alive at once during the schedule (core/memory.h)
};

PipeStep pipeline_step(Pipe pipe, const dist::Topology& topo) {
  const int S = topo.grid().pp, s = topo.coord().pp, M = kMicroBatches;
  const nn::GPTConfig cfg = piped(S);
  const auto [x, y] = global_batch(0, M * kMicroRows);
  const double inv = 1.0 / double(M * kMicroRows * kSeq);  // production's normaliser: 1 / the batch's targets
  auto micro = [](const Tensor& t, int m) { return t.narrow(0, m * kMicroRows, kMicroRows); };
  MemoryLedger& mem = ledger(Device::cpu());
  mem.reset_peaks();
  const int64_t before = mem.current(MemTag::kActivations);
  PipeStep out;
  auto keep_grads = [&](const std::vector<std::pair<std::string, Tensor>>& named) {
    for (const auto& [name, p] : named) out.grads.emplace_back(name, p.grad().to_vector());
  };
  if (pipe == Pipe::kGPipe || pipe == Pipe::k1F1B) {
    const auto kind = pipe == Pipe::kGPipe ? dist::ScheduleKind::kGPipe : dist::ScheduleKind::k1F1B;
    std::vector<int64_t> starts;
    for (int c = 0; c <= S; ++c) starts.push_back(2 * c);
    train::Stage stage(cfg, 1337, dist::PipelineSpec{kind, S, M, 1}, starts, topo);
    stage.train();
    train::GradSync sync(stage, topo);  // sums the tied wte's halves over the embedding group
    train::StepOptions o;
    o.grad_sync = &sync;
    const Tensor loss = train::forward_backward(stage, data::Batch{x, y}, o);
    out.activation_peak = double(mem.peak(MemTag::kActivations) - before);
    if (loss.defined()) out.loss = loss.item();
    keep_grads(stage.named_parameters());
    return out;
  }
  if (pipe == Pipe::kOneProcess) {  // the whole model accumulating over the same micro-batches
    nn::GPT whole(cfg, 1337);
    whole.train();
    float loss = 0;
    for (int m = 0; m < M; ++m) {
      whole.dropout_context().first_sample = m * kMicroRows;
      Tensor l = mul(whole.loss(micro(x, m), micro(y, m), Reduction::kSum), inv);
      l.backward();
      loss += float(l.item());
    }
    out.loss = loss;
    keep_grads(whole.named_parameters());
    return out;
  }
  nn::GPT part(cfg, 1337, nn::GPTStage{2 * s, 2 * s + 2, s == 0, s == S - 1});
  part.train();
  auto run = [&](const Tensor& h, int m) {                 // micro-batch m through this stage, as the executor runs it
    part.dropout_context().first_sample = m * kMicroRows;  // the dropout masks of its samples in one big batch
    Tensor act = part.blocks(2 * s, 2 * s + 2, s == 0 ? part.embed(micro(x, m)) : h);
    return s < S - 1 ? act : mul(part.head_loss(act, micro(y, m), Reduction::kSum), inv);
  };
  const Shape shape{kMicroRows, kSeq, cfg.n_embd};
  {
    MemoryTagGuard tag(MemTag::kActivations);
    out.loss = pipe == Pipe::kNaiveGPipe ? dist::naive::gpipe_step(topo.pp_group(), M, shape, run)
                                         : dist::naive::one_f_one_b_step(topo.pp_group(), M, shape, run);
  }
  out.activation_peak = double(mem.peak(MemTag::kActivations) - before);
  if (topo.embedding_group()) dist::naive::sum_shared_gradients(*topo.embedding_group(), {part.wte->weight});
  keep_grads(part.named_parameters());
  return out;
}

// The naive pipeline against production's executor: the loss and every gradient bitwise, the tied wte's too (both
// add the same two sums, each stage's accumulated in micro-batch order); the activation peak within 10% (what both
// keep alive between a micro-batch's forward and its backward; production also holds its posted receives).
void expect_same_step(const PipeStep& naive, const PipeStep& production, const dist::Topology& topo) {
  if (topo.last_stage()) EXPECT_EQ(naive.loss, production.loss);
  ASSERT_EQ(naive.grads.size(), production.grads.size());
  for (size_t i = 0; i < naive.grads.size(); ++i) {
    ASSERT_EQ(naive.grads[i].first, production.grads[i].first);
    EXPECT_EQ(naive.grads[i].second, production.grads[i].second) << naive.grads[i].first;
  }
  EXPECT_NEAR(naive.activation_peak, production.activation_peak, 0.1 * production.activation_peak)
      << "stage " << topo.coord().pp << ": naive activation peak " << naive.activation_peak << " bytes, production "
      << production.activation_peak;
}

}  // namespace

// Naive GPipe against production's GPipe over every rank as a stage (pp 2 and 3), and against one process
// accumulating the same micro-batches: bitwise but the tied wte, whose embedding and head halves one process adds
// micro-batch by micro-batch, the pipeline stage by stage (1e-6).
TEST(Naive, GPipeEqualsProductionGPipeAndOneProcess) {
  if (ctx().world_size() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const dist::Topology topo(ctx().world(), {1, 1, ctx().world_size()}, "mpi");
  const PipeStep naive = pipeline_step(Pipe::kNaiveGPipe, topo);
  expect_same_step(naive, pipeline_step(Pipe::kGPipe, topo), topo);
  const PipeStep one = pipeline_step(Pipe::kOneProcess, topo);
  if (topo.last_stage()) EXPECT_EQ(naive.loss, one.loss);
  int compared = 0;
  for (const auto& [name, grad] : naive.grads)
    for (const auto& [whole_name, whole_grad] : one.grads) {
      if (whole_name != name) continue;
      ++compared;
      if (name != "transformer.wte.weight") {
        EXPECT_EQ(grad, whole_grad) << name;
        continue;
      }
      double worst = 0;
      for (size_t j = 0; j < grad.size(); ++j) worst = std::max(worst, std::abs(grad[j] - whole_grad[j]));
      EXPECT_LE(worst, 1e-6) << name;
    }
  EXPECT_EQ(compared, int(naive.grads.size()));
}

// Naive 1F1B against production's 1F1B over every rank as a stage (pp 2 and 3). The activation peak is what proves
// the schedule: a GPipe order (every warm-up as long as M) computes the same gradients but holds M micro-batches.
TEST(Naive, OneFOneBEqualsProduction1F1B) {
  if (ctx().world_size() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const dist::Topology topo(ctx().world(), {1, 1, ctx().world_size()}, "mpi");
  expect_same_step(pipeline_step(Pipe::kNaive1F1B, topo), pipeline_step(Pipe::k1F1B, topo), topo);
}

// The naive action lists are schedules production accepts: dist::validate_schedule passes them, each rank runs its
// forwards and backwards in production's order (only where the receives sit differs: production posts them ahead),
// and the simulator finds production's bubble and micro-batches in flight.
TEST(Naive, PipelineActionListsPassTheValidatorInProductionsComputeOrder) {
  auto computes = [](const std::vector<dist::Action>& list) {
    std::vector<dist::Action> out;
    for (const dist::Action& a : list)
      if (a.kind == dist::ActionKind::kForward || a.kind == dist::ActionKind::kBackward) out.push_back(a);
    return out;
  };
  for (const auto kind : {dist::ScheduleKind::kGPipe, dist::ScheduleKind::k1F1B})
    for (int S = 2; S <= 4; ++S)
      for (int M = 1; M <= 8; ++M) {
        SCOPED_TRACE(std::string(dist::schedule_kind_name(kind)) + " S " + std::to_string(S) + " M " +
                     std::to_string(M));
        dist::Schedule naive{{kind, S, M, 1}, {}};
        for (int s = 0; s < S; ++s)
          naive.ranks.push_back(kind == dist::ScheduleKind::kGPipe ? dist::naive::gpipe_actions(S, s, M)
                                                                   : dist::naive::one_f_one_b_actions(S, s, M));
        EXPECT_NO_THROW(dist::validate_schedule(naive));
        const dist::Schedule production = dist::make_schedule(naive.spec);
        for (int s = 0; s < S; ++s) EXPECT_EQ(computes(naive.ranks[size_t(s)]), computes(production.ranks[size_t(s)]));
        const dist::SimResult a = dist::simulate(naive), b = dist::simulate(production);
        EXPECT_DOUBLE_EQ(a.bubble_fraction(), b.bubble_fraction());
        EXPECT_EQ(a.peak_in_flight, b.peak_in_flight);
      }
}
