// ZeRO stages 1 and 2 against their oracles, at world sizes 1-4: DDP over "ring" with the same padded buckets
// (bitwise: the ring's all-reduce is its reduce-scatter plus all-gather of the same chunks, and AdamW is
// elementwise), one process (SGD), the gradient norm of one process, an fp16 overflow in one rank's shard, the
// memory ledger against dist/zero.h's arithmetic, and shards whose sizes do not divide by the group size.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/rng.h"
#include "dist/shard.h"
#include "dist/topology.h"
#include "dist/zero.h"
#include "dist/zero3.h"
#include "optim/sgd.h"
#include "support/mpi_test.h"
#include "train/step.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8;

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

// Small buckets, so that a bucket holds several parameters and a shard cuts through some of them.
dist::BucketCaps small_buckets() { return {.bucket_cap_bytes = 4096, .first_bucket_cap_bytes = 1024}; }

// A deterministic global batch of `rows` sequences for a step.
data::Batch global_batch(int step, int64_t rows) {
  std::vector<int32_t> x(rows * kSeq), y(rows * kSeq);
  Philox rng(99, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {rows, kSeq}), Tensor::from_vector(y, {rows, kSeq})};
}

struct Case {
  int zero = 0;                // 0: DDP; 1, 2, 3: ZeRO stage
  bool block_buckets = false;  // DDP with ZeRO-3's buckets (one per block, then the persistent parameters)
  bool one_process = false;
  DType amp = DType::f32;
  nn::Recompute recompute = nn::Recompute::kNone;
  int64_t grad_accum = 1;
  int64_t global_batch = 24;
  bool sgd = false;      // SGD with momentum instead of AdamW
  double grad_clip = 0;  // off: the bitwise comparisons would otherwise compare two roundings of the norm
  int steps = 30;
};

struct RunResult {
  std::vector<double> losses, norms;  // the global batch's mean loss; the pre-clip gradient norm
  std::vector<std::vector<double>> weights;
};

RunResult run(const Case& c) {
  nn::GPT model(nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}, 1337);
  model.train();
  model.set_recompute(c.recompute);
  const int n = c.one_process ? 1 : ctx().world_size(), rank = c.one_process ? 0 : ctx().rank();
  std::unique_ptr<dist::Topology> topo;
  std::unique_ptr<train::GradSync> sync = std::make_unique<train::GradSync>();
  if (!c.one_process) {
    topo = std::make_unique<dist::Topology>(ctx().world(), dist::Grid{n, 1, 1}, "ring");
    if (c.zero == 0 && c.block_buckets)
      sync = std::make_unique<train::GradSync>(train::Stage::of(model), *topo,
                                               train::SyncOptions{.buckets = dist::block_buckets(model)});
    else if (c.zero == 0)
      sync = std::make_unique<train::GradSync>(train::Stage::of(model), *topo,
                                               train::SyncOptions{.caps = small_buckets()});
    else if (c.zero == 3)
      sync = std::make_unique<train::GradSync>(train::Stage::of(model), *topo, train::SyncOptions{.zero = 3});
    else
      sync = std::make_unique<train::GradSync>(train::Stage::of(model), *topo,
                                               train::SyncOptions{.zero = c.zero, .caps = small_buckets()});
  }
  auto groups = sync->optimizer_groups(optim::decay_groups(model.named_parameters(), c.sgd ? 0.0 : 0.1));
  std::unique_ptr<optim::Optimizer> opt;
  if (c.sgd)
    opt = std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  else
    opt = std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2});
  const int64_t per_rank = c.global_batch / n;
  model.dropout_context().first_sample = rank * per_rank;
  train::StepOptions o;
  o.lr = opt->lr();
  o.grad_clip = c.grad_clip;
  o.micro_batches = c.grad_accum;
  o.amp = c.amp;
  o.grad_sync = c.one_process ? &train::GradSync::one_process() : sync.get();
  RunResult result;
  for (int s = 0; s < c.steps; ++s) {
    data::Batch g = global_batch(s, c.global_batch);
    data::Batch mine{g.x.narrow(0, rank * per_rank, per_rank), g.y.narrow(0, rank * per_rank, per_rank)};
    train::StepResult r = train::train_step(model, *opt, mine, o);
    result.losses.push_back(topo ? train::sum_over(topo->dp_group(), r.loss) / n : r.loss);
    result.norms.push_back(r.grad_norm);
  }
  sync->hold_full_parameters(true);  // ZeRO-3: the blocks' parameters are gathered only while they run
  for (const Tensor& p : model.parameters()) result.weights.push_back(p.to_vector());
  return result;
}

void expect_bitwise(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_EQ(a.weights[i], b.weights[i]) << "parameter " << i;
}

void expect_close(const RunResult& a, const RunResult& b, double rel) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(a.losses[s], b.losses[s], rel * std::abs(b.losses[s])) << "step " << s;
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i)
    for (size_t j = 0; j < a.weights[i].size(); ++j)
      ASSERT_NEAR(a.weights[i][j], b.weights[i][j], rel * std::max(1.0, std::abs(b.weights[i][j])))
          << "parameter " << i << " element " << j;
}

}  // namespace

// 30 AdamW steps: stages 1 and 2 give DDP's losses and weights bit for bit, with and without bf16 autocast and
// block recomputation.
TEST(Zero, Stages1And2EqualDDPBitwiseOverRing) {
  for (DType amp : {DType::f32, DType::bf16}) {
    for (nn::Recompute rc : {nn::Recompute::kNone, nn::Recompute::kBlock}) {
      SCOPED_TRACE(std::string(dtype_name(amp)) + " recompute " + nn::recompute_name(rc));
      Case c{.amp = amp, .recompute = rc};
      const RunResult ddp = run(c);
      for (int stage : {1, 2}) {
        SCOPED_TRACE("stage " + std::to_string(stage));
        c.zero = stage;
        expect_bitwise(run(c), ddp);
      }
    }
  }
}

// Accumulation policy: full gradients are kept until the last of the micro-batches (no_sync before it), which
// reduce-scatters once, so every micro-batch is summed once, in DDP's order: bitwise DDP, and the stages agree on
// the loss. (Counting a micro-batch twice, or only the last one, would break the comparison with one process.)
TEST(Zero, AccumulationKeepsDDPsSummationOrderBitwise) {
  Case c{.grad_accum = 3, .global_batch = 36, .steps = 10};
  const RunResult ddp = run(c);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    c.zero = stage;
    expect_bitwise(run(c), ddp);
  }
}

// Against one process over the same global batch: SGD with momentum, 30 steps, within 1e-4; with 3 micro-batches
// too (each counted exactly once), and with clipping active (the norm summed over the shards).
TEST(Zero, EqualsOneProcessWithSGD) {
  for (int64_t accum : {int64_t(1), int64_t(3)}) {
    SCOPED_TRACE("grad_accum " + std::to_string(accum));
    // 36 rows: 3 micro-batches on each of 1-4 ranks.
    Case c{.grad_accum = accum, .global_batch = accum == 1 ? 24 : 36, .sgd = true, .grad_clip = 1.0};
    c.one_process = true;
    const RunResult one = run(c);
    c.one_process = false;
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      c.zero = stage;
      expect_close(run(c), one, 1e-4);
    }
  }
}

// The norm clipping uses is the one process's, within 1e-6 relative (the weights are equal at the first step, so
// the norms compare exactly there), and every rank got the same value.
TEST(Zero, GradientNormEqualsOneProcess) {
  Case c{.grad_clip = 1.0, .steps = 1};
  c.one_process = true;
  const double one = run(c).norms[0];
  c.one_process = false;
  for (int stage : {1, 2, 3}) {
    c.zero = stage;
    const double norm = run(c).norms[0];
    EXPECT_NEAR(norm, one, 1e-6 * one) << "stage " << stage;
    Tensor t = Tensor::full({1}, norm, DType::f64);
    dist::make_process_group("mpi", ctx().world())->all_reduce(t, dist::ReduceOp::kMax)->wait();
    EXPECT_EQ(t.item(), norm) << "stage " << stage << ": the ranks disagree";
  }
}

namespace {

// ZeRO with an inf planted in the last rank's shard after the last backward of the first step.
class PlantingZeroSync : public train::GradSync {
 public:
  using GradSync::GradSync;
  void after_backward() override {
    GradSync::after_backward();
    if (planted_ || ctx().rank() != ctx().world_size() - 1) return;
    owned_params({}).back().grad().fill_(INFINITY);
    planted_ = true;
  }

 private:
  bool planted_ = false;
};

}  // namespace

// fp16: an overflow in one rank's shard only skips the step on every rank (weights untouched, scale backed off),
// and the next step applies.
TEST(Zero, OverflowInOneRanksShardSkipsTheStepOnEveryRank) {
  const int n = ctx().world_size(), rank = ctx().rank();
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    nn::GPT model(nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}, 1337);
    model.train();
    dist::Topology topo(ctx().world(), dist::Grid{n, 1, 1}, "ring");
    PlantingZeroSync sync(train::Stage::of(model), topo, train::SyncOptions{.zero = stage, .caps = small_buckets()});
    optim::AdamW opt(sync.optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-2});
    optim::GradScaler scaler;
    train::StepOptions o;
    o.amp = DType::f16;
    o.scaler = &scaler;
    o.grad_sync = &sync;
    std::vector<std::vector<double>> before;
    for (const Tensor& p : model.parameters()) before.push_back(p.to_vector());
    const int64_t per_rank = 24 / n;
    data::Batch g = global_batch(0, 24);
    data::Batch mine{g.x.narrow(0, rank * per_rank, per_rank), g.y.narrow(0, rank * per_rank, per_rank)};
    train::StepResult r = train::train_step(model, opt, mine, o);
    EXPECT_FALSE(r.applied);
    EXPECT_TRUE(std::isinf(r.grad_norm));
    EXPECT_EQ(scaler.current_scale(), 32768.0);
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(model.parameters()[i].to_vector(), before[i]);
    EXPECT_TRUE(train::train_step(model, opt, mine, o).applied);
  }
}

// The ledger after setup against dist/zero.h's arithmetic, Ψ parameters over N ranks: optimizer 8Ψ/N (within
// 5%, plus the padding), gradients 4Ψ (stage 1) or 4Ψ/N (stage 2, also after a step: the full buckets live only
// during backward), parameters unchanged (the flat buffers replace the parameters' storage; padding aside, and the
// vocabulary's padding rows gone with the tied table's padded buffer).
TEST(Zero, LedgerMatchesThePrediction) {
  const int n = ctx().world_size();
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    MemoryLedger& mem = ledger();
    const int64_t params0 = mem.current(MemTag::kParams), grads0 = mem.current(MemTag::kGrads),
                  optim0 = mem.current(MemTag::kOptimizer);
    nn::GPT model(nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}, 1337);
    model.train();
    const double psi = double(model.num_parameters());
    const int64_t model_params = mem.current(MemTag::kParams) - params0;
    // The model's tied table lives in a buffer padded to vocab_pad rows; ZeRO's flat buffers take the real rows only.
    const double vocab_padding = 4.0 * double(model.config().padded_vocab() - kVocab) * 16;
    dist::Topology topo(ctx().world(), dist::Grid{n, 1, 1}, "ring");
    train::GradSync sync(train::Stage::of(model), topo, train::SyncOptions{.zero = stage, .caps = small_buckets()});
    optim::AdamW opt(sync.optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-2});
    const double padding = double(sync.zero().padded_numel()) - psi;  // elements, < N per bucket
    EXPECT_LT(padding, double(n * sync.zero().buckets().size()));
    auto expect_within = [&](const char* what, double measured, double predicted, double pad_bytes) {
      EXPECT_LE(std::abs(measured - predicted), 0.05 * predicted + pad_bytes)
          << what << ": measured " << measured << " bytes, predicted " << predicted;
    };
    expect_within("params", double(mem.current(MemTag::kParams) - params0), 4 * psi, 4 * padding);
    EXPECT_EQ(double(model_params), 4 * psi + vocab_padding);
    const double grads_predicted = stage == 1 ? 4 * psi : 4 * psi / n;
    expect_within("grads", double(mem.current(MemTag::kGrads) - grads0), grads_predicted, 4 * padding);
    expect_within("optimizer", double(mem.current(MemTag::kOptimizer) - optim0), 8 * psi / n, 8 * padding);
    // m and v of exactly the shard's elements (each block rounded up to the allocator's 64 bytes).
    EXPECT_NEAR(double(mem.current(MemTag::kOptimizer) - optim0), 8.0 * double(sync.zero().shard_numel()), 128);

    train::StepOptions o;
    o.grad_sync = &sync;
    const int64_t per_rank = 24 / n;
    data::Batch g = global_batch(0, 24);
    train::train_step(
        model, opt,
        {g.x.narrow(0, ctx().rank() * per_rank, per_rank), g.y.narrow(0, ctx().rank() * per_rank, per_rank)}, o);
    expect_within("grads after a step", double(mem.current(MemTag::kGrads) - grads0), grads_predicted, 4 * padding);
  }
}

namespace {

// Plain parameters of the given sizes.
struct Params : nn::Module {
  explicit Params(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor t = Tensor::zeros({sizes[i]});
      for (int64_t j = 0; j < sizes[i]; ++j) t.data<float>()[j] = 0.1f * float(j + 1) + float(i);
      p.push_back(register_parameter("p" + std::to_string(i), t.set_requires_grad(true)));
    }
  }
  std::vector<Tensor> p;
};

// Rank r's loss: sum_i sum_j (r + i + 1) · p_ij² / 2 + p_ij.
Tensor rank_loss(const Params& m, int rank) {
  Tensor loss;
  for (size_t i = 0; i < m.p.size(); ++i) {
    Tensor li = add(mul(sum(mul(m.p[i], m.p[i])), 0.5 * (rank + int(i) + 1)), sum(m.p[i]));
    loss = loss.defined() ? add(loss, li) : li;
  }
  return loss;
}

}  // namespace

// Sizes that do not divide by N (one bucket of 5 + 3 + 7 = 15 elements, and one bucket per parameter): every rank
// owns exactly [r·P/N, (r+1)·P/N) of each padded bucket, the shards cover every element once, and AdamW on them
// gives DDP's weights bit for bit on every rank — the non-last ranks' shards end inside a parameter, not in
// padding.
TEST(Zero, UnevenSizesArePaddedAndEveryRanksShardIsRight) {
  const int n = ctx().world_size(), rank = ctx().rank();
  auto pg = dist::make_process_group("ring", ctx().world());
  for (dist::BucketCaps caps :
       {dist::BucketCaps{}, dist::BucketCaps{.bucket_cap_bytes = 4, .first_bucket_cap_bytes = 4}}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", buckets of " + std::to_string(caps.bucket_cap_bytes));
      Params ref({5, 3, 7}), sharded({5, 3, 7});
      dist::DistributedDataParallel ddp(ref, *pg, {.caps = caps});
      dist::ZeroDataParallel zero(sharded, *pg, {.stage = stage, .caps = caps});
      optim::AdamW ddp_opt(optim::decay_groups(ref.named_parameters(), 0.1), {.lr = 0.05});
      optim::AdamW zero_opt(zero.shard_groups(optim::decay_groups(sharded.named_parameters(), 0.1)), {.lr = 0.05});
      // The shards: inside this rank's range of each bucket, and n of them cover the 15 elements once.
      Tensor covered = Tensor::full({1}, double(zero.shard_numel()), DType::f64);
      pg->all_reduce(covered, dist::ReduceOp::kSum)->wait();
      EXPECT_EQ(covered.item(), 15.0);
      int64_t expected_mine = 0;
      for (const dist::BucketSpec& b : zero.buckets()) {
        const int64_t shard = dist::padded_numel(b.numel, n) / n;
        expected_mine += std::max<int64_t>(0, std::min(b.numel, (rank + 1) * shard) - rank * shard);
      }
      EXPECT_EQ(zero.shard_numel(), expected_mine);
      for (int step = 0; step < 5; ++step) {
        rank_loss(ref, rank).backward();
        ddp_opt.step();
        ddp_opt.zero_grad();
        rank_loss(sharded, rank).backward();
        zero_opt.step();
        zero.gather_parameters();
        zero_opt.zero_grad();
      }
      for (size_t i = 0; i < ref.p.size(); ++i) EXPECT_EQ(sharded.p[i].to_vector(), ref.p[i].to_vector()) << "p" << i;
    }
  }
}

// The two mistakes ZeRO's caller can make silently, now each an error naming the fix (dist/zero.h): an optimizer
// built over the model's parameters instead of the shard groups (it would train nothing under stage 2, and save no
// memory), and a step whose gather_parameters() is forgotten (each rank keeps only its shard's update: the weights
// drift apart). Both stages 1-2 and stage 3 (on a module of its own, below) check them; once the stage is gone, the
// parameters are plain parameters again.
TEST(Zero, OptimizerOverTheFullParametersIsRefusedByName) {
  auto pg = dist::make_process_group("ring", ctx().world());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Params m({5, 3, 7});
    {
      dist::ZeroDataParallel zero(m, *pg, {.stage = stage});
      try {
        optim::AdamW wrong(optim::decay_groups(m.named_parameters(), 0.1), {.lr = 0.05});
        ADD_FAILURE() << "an optimizer over the sharded parameters was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("zero.shard_groups"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ZeroDataParallel"), std::string::npos) << e.what();
      }
    }
    EXPECT_NO_THROW(optim::AdamW fine(optim::decay_groups(m.named_parameters(), 0.1), {.lr = 0.05}));
  }
}

TEST(Zero, ForgottenGatherIsAnErrorAtTheNextBackward) {
  auto pg = dist::make_process_group("ring", ctx().world());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Params m({5, 3, 7});
    dist::ZeroDataParallel zero(m, *pg, {.stage = stage});
    optim::AdamW opt(zero.shard_groups(optim::decay_groups(m.named_parameters(), 0.1)), {.lr = 0.05});
    rank_loss(m, ctx().rank()).backward();
    opt.step();
    opt.zero_grad();  // ... and no zero.gather_parameters()
    try {
      rank_loss(m, ctx().rank()).backward();
      ADD_FAILURE() << "a backward after a step without gather_parameters() went through";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gather_parameters()"), std::string::npos) << e.what();
    }
    // Gathered, the next steps run (the reducer is ready again after the refused backward).
    zero.gather_parameters();
    EXPECT_NO_THROW({
      rank_loss(m, ctx().rank()).backward();
      opt.step();
      zero.gather_parameters();
    });
  }
}

// ZeRO-3 on a module of one's own (nn::BlockModule: it names its blocks and runs each through run_block): the
// weights of DDP over the same buckets bit for bit, the same checks as stages 1-2, and a block without trainable
// parameters refused by name.
struct TwoBlocks : nn::BlockModule {
  std::shared_ptr<nn::Linear> a, b;
  TwoBlocks() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 10));
    b = register_module("b", std::make_shared<nn::Linear>(10, 3));
  }
  int64_t num_blocks() const override { return 2; }
  std::vector<Tensor> block_parameters(int64_t i) const override { return (i == 0 ? a : b)->parameters(); }
  Tensor forward(const Tensor& x) const {
    Tensor h = run_block(0, x, [&](const Tensor& in) { return gelu(a->forward(in)); });
    return run_block(1, h, [&](const Tensor& in) { return b->forward(in); });
  }
};

Tensor two_blocks_loss(const TwoBlocks& m, int rank) {
  Tensor x = Tensor::randn({4, 6}, Philox(7, uint64_t(rank)));
  return mean(square(m.forward(x)));
}

TEST(Zero3, AnyBlockModuleEqualsDDPBitwiseOverRing) {
  auto pg = dist::make_process_group("ring", ctx().world());
  nn::manual_seed(3);
  TwoBlocks ref;
  nn::manual_seed(3);
  TwoBlocks sharded;
  dist::DistributedDataParallel ddp(ref, *pg, {.buckets = dist::block_buckets(sharded)});
  dist::ZeroStage3 zero(sharded, *pg);
  optim::AdamW ddp_opt(optim::decay_groups(ref.named_parameters(), 0.1), {.lr = 0.05});
  optim::AdamW zero_opt(zero.shard_groups(optim::decay_groups(sharded.named_parameters(), 0.1)), {.lr = 0.05});
  EXPECT_THROW(optim::AdamW(optim::decay_groups(sharded.named_parameters(), 0.1)), Error);
  for (int step = 0; step < 5; ++step) {
    two_blocks_loss(ref, ctx().rank()).backward();
    ddp_opt.step();
    ddp_opt.zero_grad();
    two_blocks_loss(sharded, ctx().rank()).backward();
    zero_opt.step();
    zero.gather_parameters();
    zero_opt.zero_grad();
  }
  EXPECT_EQ(zero.block_gathers(), 5 * 2 * 2);  // each block before its forward and its backward, every step
  zero.hold_full(true);
  const nn::NamedTensors got = sharded.named_parameters(), want = ref.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector()) << got[i].first;
  zero.hold_full(false);
  // A forgotten gather, as for stages 1-2.
  two_blocks_loss(sharded, ctx().rank()).backward();
  zero_opt.step();
  EXPECT_THROW(two_blocks_loss(sharded, ctx().rank()).backward(), Error);
}

struct EmptyBlock : TwoBlocks {
  std::vector<Tensor> block_parameters(int64_t i) const override {
    return i == 0 ? a->parameters() : std::vector<Tensor>{};
  }
};

TEST(Zero3, BlockWithoutParametersIsRefusedByName) {
  EmptyBlock m;
  try {
    dist::block_buckets(m);
    ADD_FAILURE() << "a block without parameters was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block 1 has no parameter"), std::string::npos) << e.what();
  }
}

// ---- Stage 3: parameters sharded too, gathered per block through nn::BlockHooks (dist/zero3.h) ----

// 30 AdamW steps: stage 3 gives the losses and weights of DDP with the same buckets (one per block, then the
// persistent parameters) bit for bit, in f32 and bf16 (stage 3's own 16-bit copies are autocast's casts), with
// and without block recomputation (the recomputation runs on the block gathered for its backward).
TEST(Zero3, EqualsDDPBitwiseOverRing) {
  for (DType amp : {DType::f32, DType::bf16}) {
    for (nn::Recompute rc : {nn::Recompute::kNone, nn::Recompute::kBlock}) {
      SCOPED_TRACE(std::string(dtype_name(amp)) + " recompute " + nn::recompute_name(rc));
      Case c{.block_buckets = true, .amp = amp, .recompute = rc};
      const RunResult ddp = run(c);
      c.zero = 3;
      expect_bitwise(run(c), ddp);
    }
  }
}

// Accumulation (DeepSpeed #8443, #1488): the blocks are gathered in every micro-batch but the gradients
// reduce-scatter once, after the last: each micro-batch counted once, in DDP's order, so bitwise DDP, and the
// stages agree on the loss.
TEST(Zero3, AccumulationCountsEveryMicroBatchOnceBitwise) {
  Case c{.block_buckets = true, .recompute = nn::Recompute::kBlock, .grad_accum = 3, .global_batch = 36, .steps = 10};
  const RunResult ddp = run(c);
  c.zero = 3;
  expect_bitwise(run(c), ddp);
}

namespace {

// ZeRO-3 with an inf planted in the last rank's shard after the last backward of the first step.
class PlantingZero3Sync : public train::GradSync {
 public:
  using GradSync::GradSync;
  void after_backward() override {
    GradSync::after_backward();
    if (planted_ || ctx().rank() != ctx().world_size() - 1) return;
    owned_params({}).front().grad().fill_(INFINITY);  // a block's shard
    planted_ = true;
  }

 private:
  bool planted_ = false;
};

}  // namespace

// fp16: an overflow in one rank's shard of a block skips the step on every rank, and the next step applies.
TEST(Zero3, OverflowInOneRanksShardSkipsTheStepOnEveryRank) {
  const int n = ctx().world_size(), rank = ctx().rank();
  nn::GPT model(nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}, 1337);
  model.train();
  dist::Topology topo(ctx().world(), dist::Grid{n, 1, 1}, "ring");
  PlantingZero3Sync sync(train::Stage::of(model), topo, train::SyncOptions{.zero = 3});
  optim::AdamW opt(sync.optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-2});
  optim::GradScaler scaler;
  train::StepOptions o;
  o.amp = DType::f16;
  o.scaler = &scaler;
  o.grad_sync = &sync;
  auto weights = [&] {
    sync.hold_full_parameters(true);
    std::vector<std::vector<double>> w;
    for (const Tensor& p : model.parameters()) w.push_back(p.to_vector());
    sync.hold_full_parameters(false);
    return w;
  };
  const auto before = weights();
  const int64_t per_rank = 24 / n;
  data::Batch g = global_batch(0, 24);
  data::Batch mine{g.x.narrow(0, rank * per_rank, per_rank), g.y.narrow(0, rank * per_rank, per_rank)};
  train::StepResult r = train::train_step(model, opt, mine, o);
  EXPECT_FALSE(r.applied);
  EXPECT_TRUE(std::isinf(r.grad_norm));
  EXPECT_EQ(scaler.current_scale(), 32768.0);
  EXPECT_EQ(weights(), before);
  EXPECT_TRUE(train::train_step(model, opt, mine, o).applied);
}

// The ledger against dist/zero3.h's arithmetic, Ψ parameters of which Φ persistent, N ranks: at rest parameters
// 4(Ψ−Φ)/N + 4Φ, gradients 4Ψ/N, optimizer 8Ψ/N (within 5%, plus padding); during a step at most two gathered
// blocks more (DeepSpeed #1302, #3734: prefetch and buffers beyond the prediction); and a block is gathered once
// per forward and once per backward, recomputed or not (DeepSpeed #4784: not twice for the recomputation).
TEST(Zero3, LedgerMatchesThePredictionAndBlocksGatherTwicePerStep) {
  const int n = ctx().world_size();
  for (nn::Recompute rc : {nn::Recompute::kNone, nn::Recompute::kBlock}) {
    SCOPED_TRACE(std::string("recompute ") + nn::recompute_name(rc));
    MemoryLedger& mem = ledger();
    const int64_t params0 = mem.current(MemTag::kParams), grads0 = mem.current(MemTag::kGrads),
                  optim0 = mem.current(MemTag::kOptimizer);
    nn::GPT model(nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}, 1337);
    model.train();
    model.set_recompute(rc);
    const double psi = double(model.num_parameters());
    dist::Topology topo(ctx().world(), dist::Grid{n, 1, 1}, "ring");
    train::GradSync sync(train::Stage::of(model), topo, train::SyncOptions{.zero = 3});
    optim::AdamW opt(sync.optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {.lr = 1e-2});
    dist::ZeroStage3& z = sync.zero3();
    const double phi = double(z.persistent_numel()), padding = double(z.padded_numel()) - psi;
    EXPECT_LT(padding, double(n * z.buckets().size()));
    EXPECT_GT(phi, 0.0);
    EXPECT_LT(phi, psi / 2);
    auto expect_within = [&](const char* what, double measured, double predicted, double pad_bytes) {
      EXPECT_LE(std::abs(measured - predicted), 0.05 * predicted + pad_bytes)
          << what << ": measured " << measured << " bytes, predicted " << predicted;
    };
    const double params_at_rest = 4 * (psi - phi) / n + 4 * phi;
    expect_within("params", double(mem.current(MemTag::kParams) - params0), params_at_rest, 4 * padding);
    expect_within("grads", double(mem.current(MemTag::kGrads) - grads0), 4 * psi / n, 4 * padding);
    expect_within("optimizer", double(mem.current(MemTag::kOptimizer) - optim0), 8 * psi / n, 8 * padding);

    const int64_t rest = mem.current(MemTag::kParams);
    mem.reset_peaks();
    train::StepOptions o;
    o.grad_sync = &sync;
    const int64_t per_rank = 24 / n;
    data::Batch g = global_batch(0, 24);
    train::train_step(
        model, opt,
        {g.x.narrow(0, ctx().rank() * per_rank, per_rank), g.y.narrow(0, ctx().rank() * per_rank, per_rank)}, o);
    EXPECT_EQ(z.block_gathers(), 2 * 2) << "2 blocks, each gathered for its forward and its backward";
    const double block_bytes = 4.0 * double(std::max(z.block_padded_numel(0), z.block_padded_numel(1)));
    EXPECT_LE(double(mem.peak(MemTag::kParams) - rest), 2 * block_bytes + 2 * 64) << "more than two blocks live";
    EXPECT_GE(double(mem.peak(MemTag::kParams) - rest), block_bytes) << "no block was gathered";
    EXPECT_EQ(mem.current(MemTag::kParams), rest) << "a gathered block outlived the step";
    expect_within("grads after a step", double(mem.current(MemTag::kGrads) - grads0), 4 * psi / n, 4 * padding);
  }
}
