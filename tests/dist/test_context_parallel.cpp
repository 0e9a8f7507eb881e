// Context parallelism (dist/context_parallel.h) against one process. Ring attention alone at N in {1, 2, 3, 4}
// (the world cut into groups of N), causal and not, head-tail and contiguous, with grouped kv heads: the output and
// dq, dk, dv of this rank's positions within 1e-5 (relative to the largest value) of one process's attention over
// the whole sequence in f64. The sends counted: N-1 K/V blocks a forward, N-1 and N gradients a backward. The
// balance: each rank's query-key dot products, counted position by position from the causal mask, equal under
// head-tail; the contiguous split's imbalance (seq 8, cp 2: 10 and 26). GPT-2 and Llama with dropout: the mean of
// the ranks' losses is one process's loss, and the gradients averaged over the group are one process's (1e-5).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/memory.h"
#include "core/rng.h"
#include "dist/context_parallel.h"
#include "dist/naive/ring_attention.h"
#include "dist/topology.h"
#include "nn/gpt.h"
#include "optim/sgd.h"
#include "ops/attention.h"
#include "ops/attention_blocks.h"
#include "ops/cast.h"
#include "support/mpi_test.h"
#include "train/grad_sync.h"
#include "train/stage.h"
#include "train/step.h"

using namespace minidl;

namespace {

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

// max |a - b| / max |b|
double relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  std::vector<double> u = a.to_vector(), v = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < u.size(); ++i)
    diff = std::max(diff, std::abs(u[i] - v[i])), scale = std::max(scale, std::abs(v[i]));
  return diff / std::max(scale, 1e-300);
}

struct Attention {
  Tensor out, dqkv;  // (B, T, H D), (B, T, (H + 2 Hkv) D)
};

// One process, f64: the attention of the whole qkv and the gradient of sum(out * w).
Attention one_process(const Tensor& qkv, const Tensor& w, int H, int Hkv, bool causal) {
  const Tensor x = ops::cast(qkv, DType::f64), w64 = ops::cast(w, DType::f64);
  const int64_t D = x.size(2) / (H + 2 * Hkv);
  if (causal) {
    Tensor leaf = x.detach().set_requires_grad(true);
    Tensor out = causal_attention(leaf, H, Hkv);
    sum(out * w64).backward();
    return {out.detach(), leaf.grad()};
  }
  const Tensor q = x.narrow(2, 0, H * D).contiguous(), k = x.narrow(2, H * D, Hkv * D).contiguous(),
               v = x.narrow(2, (H + Hkv) * D, Hkv * D).contiguous();
  ops::AttentionForward f = ops::attention_block_forward(q, k, v, H, Hkv, false);
  ops::AttentionBlockGrads g = ops::attention_block_backward(w64, q, k, v, f.out, f.lse, H, Hkv, false);
  Tensor dqkv = Tensor::empty(x.shape(), DType::f64);
  dqkv.narrow(2, 0, H * D).copy_(g.dq);
  dqkv.narrow(2, H * D, Hkv * D).copy_(g.dk);
  dqkv.narrow(2, (H + Hkv) * D, Hkv * D).copy_(g.dv);
  return {f.out, dqkv};
}

const char* split_name(dist::CpSplit s) { return s == dist::CpSplit::kHeadTail ? "head-tail" : "contiguous"; }

}  // namespace

TEST(ContextParallel, RingAttentionEqualsOneProcess) {
  const int world = ctx().world_size();
  for (int n = 1; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .tp = n}, "mpi");  // the tp groups: n consecutive ranks
    dist::ProcessGroup& group = topo.tp_group();
    for (auto [H, Hkv] : {std::pair{4, 4}, std::pair{4, 2}})
      for (bool causal : {true, false})
        for (dist::CpSplit split : {dist::CpSplit::kHeadTail, dist::CpSplit::kContiguous}) {
          const int64_t B = 2, T = 24, D = 8;  // T a multiple of 2n for n <= 4
          const Tensor qkv = Tensor::randn({B, T, (H + 2 * Hkv) * D}, Philox(11, uint64_t(H + Hkv)));
          const Tensor w = Tensor::randn({B, T, H * D}, Philox(12));
          const Attention whole = one_process(qkv, w, H, Hkv, causal);
          dist::ContextParallel cp(group, T, split);
          Tensor mine = cp.split(qkv).set_requires_grad(true);
          dist::reset_context_parallel_traffic();
          Tensor out = cp.attention(mine, H, Hkv, causal);
          const dist::ContextParallelTraffic after_forward = dist::context_parallel_traffic();
          sum(out * cp.split(w)).backward();
          const dist::ContextParallelTraffic sent = dist::context_parallel_traffic();
          const std::string what = "N " + std::to_string(n) + ", H " + std::to_string(H) + ", Hkv " +
                                   std::to_string(Hkv) + (causal ? ", causal, " : ", not causal, ") +
                                   split_name(split) + ", rank " + std::to_string(group.rank());
          EXPECT_LE(relative_error(out, cp.split(whole.out)), 1e-5) << what << ": output";
          const Tensor g = mine.grad(), want = cp.split(whole.dqkv);
          EXPECT_LE(relative_error(g.narrow(2, 0, H * D), want.narrow(2, 0, H * D)), 1e-5) << what << ": dq";
          EXPECT_LE(relative_error(g.narrow(2, H * D, Hkv * D), want.narrow(2, H * D, Hkv * D)), 1e-5)
              << what << ": dk";
          EXPECT_LE(relative_error(g.narrow(2, (H + Hkv) * D, Hkv * D), want.narrow(2, (H + Hkv) * D, Hkv * D)), 1e-5)
              << what << ": dv";
          EXPECT_EQ(after_forward.forward_kv_sends, n - 1) << what;
          EXPECT_EQ(sent.backward_kv_sends, n - 1) << what;
          EXPECT_EQ(sent.backward_grad_sends, n > 1 ? n : 0) << what;
        }
  }
}

// split then gather is the identity, and split's runs are the chunks the balance assigns.
TEST(ContextParallel, SplitAndGatherAreInverses) {
  dist::Topology topo(ctx().world(), {.dp = 1, .tp = ctx().world_size()}, "mpi");
  for (dist::CpSplit split : {dist::CpSplit::kHeadTail, dist::CpSplit::kContiguous}) {
    const int64_t T = 4 * ctx().world_size();
    dist::ContextParallel cp(topo.tp_group(), T, split);
    std::vector<int64_t> ids(size_t(2 * T));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i);
    const Tensor x = Tensor::from_vector(ids, {2, T});
    const Tensor mine = cp.split(x);
    std::vector<double> m = mine.to_vector();
    for (const nn::PositionRun& r : cp.runs())
      for (int64_t i = 0; i < r.length; ++i)
        EXPECT_EQ(m[size_t(r.local + i)], double(r.global + i)) << split_name(split);
    EXPECT_EQ(cp.gather(mine).to_vector(), x.to_vector()) << split_name(split);
  }
}

TEST(ContextParallel, RefusesASequenceItCannotSplit) {
  dist::Topology topo(ctx().world(), {.dp = 1, .tp = ctx().world_size()}, "mpi");
  const int n = ctx().world_size();
  try {
    dist::ContextParallel cp(topo.tp_group(), 2 * n + 1, dist::CpSplit::kHeadTail);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(2 * n + 1)), std::string::npos) << m;
    EXPECT_NE(m.find("2 x --cp = " + std::to_string(2 * n)), std::string::npos) << m;
  }
}

// The balance: each rank's dot products as the ring's blocks count them equal a count position by position over the
// causal mask (query p sees keys 0..p); head-tail gives every rank the same, the contiguous split does not.
TEST(ContextParallel, HeadTailBalancesTheCausalWork) {
  dist::Topology topo(ctx().world(), {.dp = 1, .tp = ctx().world_size()}, "mpi");
  const int n = ctx().world_size();
  for (int64_t T : {int64_t(2 * n), int64_t(8 * n), int64_t(24 * n)})
    for (dist::CpSplit split : {dist::CpSplit::kHeadTail, dist::CpSplit::kContiguous}) {
      dist::ContextParallel cp(topo.tp_group(), T, split);
      std::vector<int64_t> dots;
      for (int r = 0; r < n; ++r) {
        int64_t by_position = 0;
        const int64_t c = cp.chunk();
        for (int64_t chunk : cp.chunks_of(r))
          for (int64_t p = chunk * c; p < (chunk + 1) * c; ++p) by_position += p + 1;
        EXPECT_EQ(cp.dot_products(r), by_position) << split_name(split) << ", T " << T << ", rank " << r;
        EXPECT_EQ(cp.dot_products(r, false), cp.local() * T) << "not causal: every query sees every key";
        dots.push_back(cp.dot_products(r));
      }
      const auto [lo, hi] = std::minmax_element(dots.begin(), dots.end());
      if (split == dist::CpSplit::kHeadTail)
        EXPECT_EQ(*lo, *hi) << "T " << T;
      else
        EXPECT_LT(*lo, *hi) << "T " << T;
    }
  if (n == 2) {  // the example: seq 8, cp 2, contiguous: 10 and 26
    dist::ContextParallel contiguous(topo.tp_group(), 8, dist::CpSplit::kContiguous);
    EXPECT_EQ(contiguous.dot_products(0), 10);
    EXPECT_EQ(contiguous.dot_products(1), 26);
    dist::ContextParallel balanced(topo.tp_group(), 8, dist::CpSplit::kHeadTail);
    EXPECT_EQ(balanced.dot_products(0), 18);
    EXPECT_EQ(balanced.dot_products(1), 18);
  }
}

namespace {

nn::GPTConfig gpt2(double dropout) {
  return {
      .vocab_size = 29, .block_size = 48, .n_layer = 2, .n_head = 4, .n_embd = 32, .dropout = dropout, .bias = true};
}
nn::GPTConfig llama(double dropout) {
  nn::GPTConfig c{
      .vocab_size = 29, .block_size = 48, .n_layer = 2, .n_head = 4, .n_embd = 32, .dropout = dropout, .bias = false};
  c.arch = nn::GPTConfig::Arch::kLlama;
  c.n_kv_head = 2;
  c.intermediate_size = 48;
  c.norm_eps = 1e-6;
  c.rope_theta = 1e4;
  return c;
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  std::vector<int32_t> ids(size_t(B * T));
  Philox rng(5, stream);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(rng.draw(i).x % uint32_t(V));
  return Tensor::from_vector(ids, {B, T});
}

}  // namespace

// The model through the seam (dist::apply_context_parallel): GPT-2 (learned positions) and Llama (rotary positions,
// grouped kv heads), with dropout, at every N this world divides into. The labels are y = the next token of the
// whole sequence, split like x; each rank's loss is the mean over its own positions, so their mean is one
// process's loss, and the gradients averaged over the group are one process's.
TEST(ContextParallel, ModelsEqualOneProcess) {
  const int world = ctx().world_size();
  for (int n = 1; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .tp = n}, "mpi");
    dist::ProcessGroup& group = topo.tp_group();
    for (const nn::GPTConfig& cfg : {gpt2(0.1), llama(0.1)}) {
      const int64_t B = 2, T = 24;
      const Tensor ids = random_ids(B, T + 1, cfg.vocab_size, 3);
      const Tensor x = ids.narrow(1, 0, T).contiguous(), y = ids.narrow(1, 1, T).contiguous();  // shifted, then split
      auto run = [&](bool split) {
        nn::GPT model(cfg, 1337);
        model.train();
        model.dropout_context().step = 2;
        dist::ContextParallel cp(group, T);
        if (split) dist::apply_context_parallel(model, cp);
        Tensor loss = split ? model.loss(cp.split(x), cp.split(y)) : model.loss(x, y);
        loss.backward();
        std::vector<Tensor> grads;
        for (const Tensor& p : model.parameters()) grads.push_back(p.grad().contiguous());
        return std::pair{loss.item(), grads};
      };
      auto [whole_loss, whole_grads] = run(false);
      auto [my_loss, my_grads] = run(true);
      Tensor l = Tensor::from_vector(std::vector<double>{my_loss}, {1}, DType::f64);
      group.all_reduce(l, dist::ReduceOp::kAvg)->wait();
      const std::string what = std::string(cfg.llama() ? "Llama" : "GPT-2") + ", N " + std::to_string(n);
      EXPECT_NEAR(l.item(), whole_loss, 1e-6 * std::abs(whole_loss)) << what;
      for (size_t i = 0; i < my_grads.size(); ++i) {
        group.all_reduce(my_grads[i], dist::ReduceOp::kAvg)->wait();
        EXPECT_LE(relative_error(my_grads[i], whole_grads[i]), 1e-5) << what << ", parameter " << i;
      }
    }
  }
}

// The teaching ring (dist/naive/ring_attention.h): production's output and dq, dk, dv bit for bit (the same blocks
// merged and summed in the same order), causal and head-tail, at every N this world divides into.
TEST(ContextParallel, NaiveRingAttentionIsProductionBitForBit) {
  const int world = ctx().world_size();
  for (int n = 1; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .tp = n}, "mpi");
    dist::ProcessGroup& group = topo.tp_group();
    for (auto [H, Hkv] : {std::pair{4, 4}, std::pair{4, 1}}) {
      const int64_t B = 2, T = 24, D = 8;
      dist::ContextParallel cp(group, T);
      const Tensor qkv = cp.split(Tensor::randn({B, T, (H + 2 * Hkv) * D}, Philox(21, uint64_t(Hkv))));
      const Tensor w = cp.split(Tensor::randn({B, T, H * D}, Philox(22)));
      Tensor leaf = qkv.detach().set_requires_grad(true);
      Tensor out = cp.attention(leaf, H, Hkv);
      sum(out * w).backward();
      const dist::naive::RingAttentionForward f = dist::naive::ring_attention_forward(qkv, H, Hkv, group);
      const Tensor dqkv = dist::naive::ring_attention_backward(w, qkv, f, H, Hkv, group);
      const std::vector<double> got = out.to_vector(), a = f.out[0].to_vector(), b = f.out[1].to_vector();
      std::vector<double> naive_out;
      const int64_t c = T / (2 * n), W = H * D;
      for (int64_t r = 0; r < B; ++r)
        for (const std::vector<double>* part : {&a, &b})
          naive_out.insert(naive_out.end(), part->begin() + r * c * W, part->begin() + (r + 1) * c * W);
      const std::string what = "N " + std::to_string(n) + ", Hkv " + std::to_string(Hkv);
      EXPECT_EQ(got, naive_out) << what << ": output";
      EXPECT_EQ(leaf.grad().to_vector(), dqkv.to_vector()) << what << ": dqkv";
    }
  }
}

// Memory: the activations a forward keeps for backward (the ledger's kActivations after the forward, the loss
// held) are 1/N of one process's within 5%: the ring keeps qkv, the merged output and lse, as the fused attention
// does (not also copies of q and K|V: that was 1.17/N). Printed for the record: bytes at N, the ratio to N 1.
TEST(ContextParallel, ActivationsPerRankAreAboutOneNth) {
  const int world = ctx().world_size();
  nn::GPTConfig cfg = gpt2(0.0);
  cfg.block_size = 192;
  const int64_t B = 2, T = 192;
  const Tensor ids = random_ids(B, T + 1, cfg.vocab_size, 9);
  const Tensor x = ids.narrow(1, 0, T).contiguous(), y = ids.narrow(1, 1, T).contiguous();
  auto kept = [&](dist::ContextParallel* cp) {
    nn::GPT model(cfg, 1337);
    model.train();
    if (cp) dist::apply_context_parallel(model, *cp);
    MemoryLedger& mem = ledger(Device::cpu());
    const int64_t before = mem.current(MemTag::kActivations);
    Tensor loss;
    {
      MemoryTagGuard tag(MemTag::kActivations);
      loss = cp ? model.loss(cp->split(x), cp->split(y)) : model.loss(x, y);
    }
    return double(mem.current(MemTag::kActivations) - before);
  };
  const double one = kept(nullptr);
  for (int n = 2; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .tp = n}, "mpi");
    dist::ContextParallel cp(topo.tp_group(), T);
    const double mine = kept(&cp);
    if (ctx().rank() == 0)
      std::printf("context parallel activations: N 1 %.0f bytes, N %d %.0f bytes a rank (%.3f of N 1, 1/N = %.3f)\n",
                  one, n, mine, mine / one, 1.0 / n);
    EXPECT_LE(mine, 1.05 * one / n) << "N " << n;
    EXPECT_GE(mine, 0.95 * one / n) << "N " << n;
  }
}

// Each position's loss in the model's logits (B, T, V), in double: -log softmax at the target (NaN where ignored).
std::vector<double> token_losses(const Tensor& logits, const Tensor& targets) {
  const int64_t N = logits.size(0) * logits.size(1), V = logits.size(2);
  const std::vector<double> z = logits.to_vector(), t = targets.to_vector();
  std::vector<double> out(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    const double* row = z.data() + i * V;
    const double mx = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    out[size_t(i)] = t[size_t(i)] < 0 ? NAN : mx + std::log(sum) - row[int64_t(t[size_t(i)])];
  }
  return out;
}

// The tokens at the chunk boundaries (the last position of a chunk, whose target opens the next chunk, and the
// first of the next, whose keys come from another rank) lose what one process's lose: the labels were shifted on
// the whole sequence and split with the inputs. Every position's loss, gathered in sequence order, within 1e-5 of
// one process's (GPT-2 and Llama, N 2-4, dropout on).
TEST(ContextParallel, ChunkBoundaryTokensLoseWhatOneProcessLoses) {
  const int world = ctx().world_size();
  for (int n = 2; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .cp = n}, "mpi");
    for (const nn::GPTConfig& cfg : {gpt2(0.1), llama(0.1)}) {
      const int64_t B = 2, T = 24;
      const Tensor ids = random_ids(B, T + 1, cfg.vocab_size, 4);
      const Tensor x = ids.narrow(1, 0, T).contiguous(), y = ids.narrow(1, 1, T).contiguous();
      dist::ContextParallel cp(topo.cp_group(), T);
      auto losses = [&](bool split) {
        autograd::NoGradGuard no_grad;
        nn::GPT model(cfg, 1337);
        model.train();
        model.dropout_context().step = 1;
        if (!split) return token_losses(model.forward(x), y);
        dist::apply_context_parallel(model, cp);
        return token_losses(cp.gather(model.forward(cp.split(x))), y);
      };
      const std::vector<double> want = losses(false), got = losses(true);
      const int64_t c = T / (2 * n);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const size_t i = size_t(b * T + t);
          EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]))
              << (cfg.llama() ? "Llama" : "GPT-2") << ", N " << n << ", sequence " << b << ", position " << t
              << (t % c == c - 1 || t % c == 0 ? " (a chunk boundary)" : "");
        }
    }
  }
}

// The step's normaliser (train/step.cpp): a context-parallel rank divides its targets' loss by the whole sequences'
// target count over cp, not by its own count. Ignored (-1) targets, all in the first chunk, leave rank 0 fewer
// targets than the others: a rank dividing by its own count would weigh each of its tokens more (verl #4250's loss
// scaled by local tokens). train_step over a dp × cp topology (GradSync averaging over both), two micro-batches,
// dropout on, SGD at lr 1e3: the loss averaged over the ranks and every parameter's step equal one process's.
TEST(ContextParallel, TrainStepNormalisesByTheWholeSequencesTargets) {
  const int world = ctx().world_size();
  const nn::GPTConfig cfg = gpt2(0.1);
  const int64_t B = 4, T = 24;
  const Tensor ids = random_ids(B, T + 1, cfg.vocab_size, 6);
  std::vector<int32_t> targets;
  for (double v : ids.narrow(1, 1, T).contiguous().to_vector()) targets.push_back(int32_t(v));
  for (int64_t t = 0; t < 3; ++t) targets[size_t(t)] = targets[size_t(2 * T + t)] = -1;  // in chunk 0 at any N <= 4
  const data::Batch batch{ids.narrow(1, 0, T).contiguous(), Tensor::from_vector(targets, {B, T})};
  auto step = [&](train::Stage& stage, train::GradSync& sync) {
    stage.train();
    stage.set_dropout(3, 0);
    std::vector<Tensor> before;
    for (const Tensor& p : stage.parameters()) before.push_back(p.detach().clone());
    optim::SGD opt({{stage.parameters(), 0.0}}, {});
    train::StepOptions o;
    o.lr = 1e3;  // steps far above the parameters' rounding
    o.grad_clip = 0;
    o.grad_sync = &sync;
    const double loss = train::train_step(stage, opt, batch, o).loss;
    std::vector<Tensor> moved;
    const std::vector<Tensor> after = stage.parameters();
    for (size_t i = 0; i < after.size(); ++i) moved.push_back(sub(before[i], after[i].detach()));
    return std::pair{loss, moved};
  };
  nn::GPT whole(cfg, 1337);
  train::Stage one = train::Stage::of(whole, 2);
  auto [want_loss, want_moves] = step(one, train::GradSync::one_process());
  for (int n = 1; n <= world; ++n) {
    if (world % n != 0) continue;
    dist::Topology topo(ctx().world(), {.dp = world / n, .cp = n}, "mpi");
    const dist::PipelineSpec spec{.kind = dist::ScheduleKind::k1F1B, .stages = 1, .micro_batches = 2};
    train::Stage stage(cfg, 1337, spec, {0, cfg.n_layer}, topo);
    stage.set_context_parallel(std::make_shared<dist::ContextParallel>(topo.cp_group(), T));
    train::GradSync sync(stage, topo);
    auto [loss, moves] = step(stage, sync);
    Tensor l = Tensor::from_vector(std::vector<double>{loss}, {1}, DType::f64);
    topo.dp_group().all_reduce(l, dist::ReduceOp::kAvg)->wait();  // every dp copy saw the same batch
    EXPECT_NEAR(l.item(), want_loss, 1e-6 * want_loss) << "N " << n;
    ASSERT_EQ(moves.size(), want_moves.size());
    for (size_t i = 0; i < moves.size(); ++i)
      EXPECT_LE(relative_error(moves[i], want_moves[i]), 1e-5) << "N " << n << ", parameter " << i;
  }
}
