// The predictor put together: its memory is train::predict_memory's, its bubble dist::simulate's (and the
// formula's), its breakdown adds up, its compute follows the roofline, and --plan ranks by predicted time.
#include <gtest/gtest.h>

#include <algorithm>

#include "dist/pipeline.h"
#include "predict/collectives.h"
#include "predict/compute.h"
#include "predict/predict.h"
#include "tests/predict/fixtures.h"
#include "train/zero_memory.h"

namespace minidl::predict {
namespace {

using testing::baby;
using testing::toy_machine;

TEST(PredictCompute, RooflineIsTheSlowerOfFlopsAndBytes) {
  const Machine m = toy_machine();
  // 2e9 FLOPs and 1e6 bytes: compute-bound, 2 ms at 1 TFLOP/s; with 1e9 bytes, memory-bound, 10 ms.
  EXPECT_DOUBLE_EQ(op_seconds({"gemm", OpClass::kGemm, 2e9, 1e6}, m, DType::f32), 2e-3);
  EXPECT_DOUBLE_EQ(op_seconds({"gemm", OpClass::kGemm, 2e9, 1e9}, m, DType::f32), 1e-2);
  Machine half = m;
  half.eff.gemm = 0.5;  // half the peak: twice the time
  EXPECT_DOUBLE_EQ(op_seconds({"gemm", OpClass::kGemm, 2e9, 1e6}, half, DType::f32), 4e-3);
  // Elementwise: bytes over bandwidth × efficiency.
  half.eff.elementwise = 0.5;
  EXPECT_DOUBLE_EQ(op_seconds({"ln", OpClass::kElementwise, 0, 1e9}, half, DType::f32), 2e-2);
}

TEST(PredictCompute, BlockFlopsAreNanoGptsCountSplitOverTp) {
  // Per token and block: 6·12C² for the products (forward 2, backward 4) and 12·C·T for attention (nanoGPT).
  ComputeQuery q{baby(), 1, false, DType::f32, 3, 64, nn::Recompute::kNone};
  double flops = 0;
  for (const auto& ops : {block_forward_ops(q), block_backward_ops(q)})
    for (const OpCost& op : ops) flops += op.flops;
  const double C = 128, T = 64, BT = 3 * 64;
  EXPECT_DOUBLE_EQ(flops, BT * (6 * 12 * C * C + 12 * C * T));
  q.tp = 2;
  double split = 0;
  for (const OpCost& op : block_forward_ops(q)) split += op.flops;
  EXPECT_DOUBLE_EQ(split, BT * (2 * 12 * C * C + 4 * C * T) / 2);
}

// A Llama (GQA 4:2, SwiGLU 344 wide): the block's products are its own matrices (q and o C·HD, k and v C·KV·D,
// gate, up and down C·I), and the model's FLOPs per token are nn::GPT's own count of the same model.
TEST(PredictCompute, LlamaBlockFlopsAreItsMatricesAndTheModelsCount) {
  nn::GPTConfig llama = baby();
  llama.arch = nn::GPTConfig::Arch::kLlama;
  llama.bias = false;
  llama.n_kv_head = 2;
  llama.intermediate_size = 344;
  ComputeQuery q{llama, 1, false, DType::f32, 3, 64, nn::Recompute::kNone};
  double flops = 0;
  for (const auto& ops : {block_forward_ops(q), block_backward_ops(q)})
    for (const OpCost& op : ops) flops += op.flops;
  const double C = 128, T = 64, BT = 3 * 64, KVD = 64, I = 344;
  EXPECT_DOUBLE_EQ(flops, BT * (6 * (2 * C * C + 2 * C * KVD + 3 * C * I) + 12 * C * T));
  EXPECT_DOUBLE_EQ(model_flops_per_token(llama, 64), nn::GPT(llama, 0).flops_per_token(64));
  EXPECT_DOUBLE_EQ(model_flops_per_token(baby(), 64), nn::GPT(baby(), 0).flops_per_token(64));
}

// Tensor parallelism of a Llama: each of its 5 column-parallel layers (q, k, v, gate, up) all-reduces its input
// gradient, against GPT-2's 2 (c_attn, c_fc); the forward's 2 are the row-parallel layers', as GPT-2's.
TEST(PredictStep, LlamaTensorParallelismAllReducesPerColumnParallelLayer) {
  nn::GPTConfig llama = baby();
  llama.arch = nn::GPTConfig::Arch::kLlama;
  llama.bias = false;
  llama.n_kv_head = 2;
  Layout l;
  l.tp = 2;
  const Machine m = toy_machine();
  const double act = 12.0 * 64 * 128 * 4 / 10e9 + 2e-6, loss = 3 * (12.0 * 64 * 4 / 10e9 + 2e-6);
  EXPECT_NEAR(predict(Workload{llama, 12}, l, m).time.tp_comm, 4 * (2 + 5) * act + 2 * act + loss, 1e-12);
  llama.n_kv_head = 1;
  EXPECT_NE(refusal(Workload{llama, 12}, l).find("num_key_value_heads 1 is not divisible by tp 2"), std::string::npos);
}

TEST(PredictMemory, EqualsTrainPredictMemoryForTheSameQuery) {
  const Workload w{baby(), 24};
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.micro_batches = 2;
  l.zero = 2;
  l.recompute = nn::Recompute::kBlock;
  l.amp = DType::bf16;
  l.sequence_parallel = true;
  const Prediction p = predict(w, l, toy_machine());
  // b = 24 / (2 · 2) = 6 sequences per micro-batch, accumulated over 2.
  const train::MemoryPlan want =
      train::predict_memory({baby(), 2, 2, DType::bf16, nn::Recompute::kBlock, 6, 64, 2, 2, true});
  EXPECT_EQ(p.micro_batch, 6);
  EXPECT_DOUBLE_EQ(p.memory.params_rest, want.params_rest);
  EXPECT_DOUBLE_EQ(p.memory.params_step, want.params_step);
  EXPECT_DOUBLE_EQ(p.memory.grads_rest, want.grads_rest);
  EXPECT_DOUBLE_EQ(p.memory.grads_step, want.grads_step);
  EXPECT_DOUBLE_EQ(p.memory.optimizer, want.optimizer);
  EXPECT_DOUBLE_EQ(p.activation_bytes, want.activations);  // pp = 1: one micro-batch in flight
  EXPECT_DOUBLE_EQ(p.memory_peak, want.peak());
}

TEST(PredictPipeline, BubbleIsSimulatesAndTheFormulas) {
  for (dist::ScheduleKind kind : {dist::ScheduleKind::kGPipe, dist::ScheduleKind::k1F1B}) {
    const dist::PipelineSpec spec{kind, 4, 8, 1};
    const PipelineTime t = pipeline_time(spec, 1.0, 2.0);
    EXPECT_DOUBLE_EQ(t.bubble_fraction, dist::simulate(dist::make_schedule(spec), 1.0, 2.0).bubble_fraction());
    EXPECT_NEAR(t.bubble_fraction, 3.0 / 11.0, 1e-12);  // (p − 1)/(M + p − 1)
    EXPECT_NEAR(t.bubble, 3.0 * (1.0 + 2.0), 1e-12);    // (p − 1)(F + B) on the busiest rank
  }
  const dist::PipelineSpec interleaved{dist::ScheduleKind::kInterleaved, 2, 4, 2};
  EXPECT_NEAR(pipeline_time(interleaved, 1.0, 2.0).bubble_fraction, 1.0 / 9.0, 1e-12);  // (p−1)/(V·M + p−1)
}

TEST(PredictPipeline, APredictionsBubbleIsSimulatesForItsOwnCosts) {
  const Workload w{nn::GPTConfig{65, 64, 8, 4, 128, 0.0, true}, 16};
  Layout l;
  l.pp = 4;
  l.micro_batches = 8;
  const Prediction p = predict(w, l, toy_machine());
  const dist::SimResult sim =
      dist::simulate(dist::make_schedule({dist::ScheduleKind::k1F1B, 4, 8, 1}), p.forward, p.backward);
  EXPECT_DOUBLE_EQ(p.bubble_fraction, sim.bubble_fraction());
  EXPECT_NEAR(p.time.bubble, sim.makespan - 8 * (p.forward + p.backward), 1e-15);
  // 1F1B keeps up to p micro-batches in flight on the first rank.
  EXPECT_EQ(p.activations_in_flight, 4);
  EXPECT_DOUBLE_EQ(p.activation_bytes, 4 * p.memory.activations);
}

TEST(PredictStep, BreakdownAddsUpAndRatesFollowFromIt) {
  const Workload w{baby(), 24};
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.pp = 2;
  l.micro_batches = 2;
  const Prediction p = predict(w, l, toy_machine());
  const StepTime& t = p.time;
  EXPECT_DOUBLE_EQ(t.total(), t.compute + t.tp_comm + t.pp_comm + t.dp_comm + t.bubble + t.optimizer + t.zero_copies);
  EXPECT_NEAR(p.compute_by_class.total(), t.compute, 1e-12 * t.compute);
  EXPECT_GT(t.tp_comm, 0);
  EXPECT_GT(t.pp_comm, 0);
  EXPECT_GT(p.dp_comm_total, 0);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 24.0 * 64 / t.total());
  EXPECT_DOUBLE_EQ(p.mfu, p.model_flops / (t.total() * 8 * 1e12));
  EXPECT_DOUBLE_EQ(p.efficiency, p.single_gpu_step / (8 * t.total()));
}

// On a GPU the buckets' collectives hide behind the rest of the backward but for the last; on a CPU machine they
// are the core's own work, so all of them are on the step.
TEST(PredictStep, CpuCoresHideNoCommunication) {
  const Workload w{baby(), 24};
  Layout l;
  l.dp = 2;
  Machine m = toy_machine();
  m.intra = {1e-5, 1e9};  // slow enough that the buckets take time
  const Prediction gpu = predict(w, l, m);
  EXPECT_LT(gpu.time.dp_comm, gpu.dp_comm_total);
  m.cpu = true;
  const Prediction cpu = predict(w, l, m);
  EXPECT_DOUBLE_EQ(cpu.time.dp_comm, cpu.dp_comm_total);
  EXPECT_DOUBLE_EQ(cpu.dp_comm_total, gpu.dp_comm_total);
}

TEST(PredictZero, CopiesAreTheBytesZeroMovesBeyondDdp) {
  // The baby config's parameters: 4 blocks of 12C² + 13C, wte (65·C), wpe (64·C) and ln_f (2C) at C = 128.
  const double C = 128, blocks = 4 * (12 * C * C + 13 * C), params = blocks + 65 * C + 64 * C + 2 * C;
  auto bytes = [](const std::vector<OpCost>& ops) {
    double b = 0;
    for (const OpCost& op : ops) b += op.bytes;
    return b;
  };
  EXPECT_DOUBLE_EQ(bytes(zero_ops(0, params, blocks, 1, DType::f32, true)), 0);
  // ZeRO-1: every gradient bucket zeroed after the gather, 4 bytes a parameter.
  EXPECT_DOUBLE_EQ(bytes(zero_ops(1, params, blocks, 1, DType::f32, true)), 4 * params);
  // ZeRO-2 and 3 on the CPU in f32: the zero-filled bucket (4), the copy into it (8) and the fresh .grad() (8)
  // where DDP's GEMM adds in place; elsewhere the fresh copy replaces DDP's add of 12: 4 + 8 − 4.
  EXPECT_DOUBLE_EQ(bytes(zero_ops(2, params, blocks, 4, DType::f32, true)), 20 * params);
  EXPECT_DOUBLE_EQ(bytes(zero_ops(2, params, blocks, 4, DType::bf16, true)), 8 * params);
  EXPECT_DOUBLE_EQ(bytes(zero_ops(2, params, blocks, 4, DType::f32, false)), 8 * params);
  EXPECT_DOUBLE_EQ(bytes(zero_ops(3, params, blocks, 1, DType::f32, true)), 20 * params);
  // ZeRO-3 with amp: each block cast (4 read + 2 written) after its 2 gathers in each of 4 micro-batches, less
  // DDP's one cast a step.
  EXPECT_DOUBLE_EQ(bytes(zero_ops(3, params, blocks, 4, DType::bf16, false)), 8 * params + 6 * 7 * blocks);

  // In a prediction: the same bytes over the memory-bound ops' bandwidth (100 GB/s × 0.5), dp 2, M 2.
  Machine m = toy_machine();
  m.eff.elementwise = 0.5;
  m.cpu = true;
  const Workload w{baby(), 24};
  Layout l;
  l.dp = 2;
  l.micro_batches = 2;
  EXPECT_DOUBLE_EQ(predict(w, l, m).time.zero_copies, 0);
  for (int stage : {1, 2, 3}) {
    l.zero = stage;
    const Prediction p = predict(w, l, m);
    EXPECT_NEAR(p.time.zero_copies, (stage == 1 ? 4 : 20) * params / 50e9, 1e-15) << "ZeRO-" << stage;
    EXPECT_DOUBLE_EQ(p.time.total(), p.time.compute + p.time.dp_comm + p.time.optimizer + p.time.zero_copies);
  }
}

// Sequence parallelism, term by term as dist/sequence_parallel.cpp runs it on the baby (b 12, T 64, C 128, 4
// blocks, tp 2): 26 all-gathers (6 a block, the embedding's backward, the head's input) and 18 reduce-scatters (4 a
// block, the embedding's sums, the head input's gradient), each at the link measured for it and with its two layout
// copies, plus the vocabulary-parallel loss's 3 all-reduces of b·T floats.
TEST(PredictStep, SequenceParallelRunsItsCollectivesAtTheirOwnLinks) {
  Machine m = toy_machine();
  m.measured[int(Collective::kReduceScatter)] = Link{0.0, 1e9};
  m.measured[int(Collective::kAllGather)] = Link{0.0, 2e9};
  Layout l;
  l.tp = 2;
  l.sequence_parallel = true;
  const Prediction p = predict(Workload{baby(), 12}, l, m);
  const double bytes = 12.0 * 64 * 128 * 4, copies = 2 * (bytes + bytes / 2) / 100e9;
  const double gather = bytes / 2 / 2e9 + copies, scatter = bytes / 2 / 1e9 + copies;
  const double loss = 3 * (12.0 * 64 * 4 / 10e9 + 2e-6);  // the ring at n = 2: S/β + 2α
  EXPECT_NEAR(p.time.tp_comm, 26 * gather + 18 * scatter + loss, 1e-12);
  // The same layout without sequence parallelism: all-reduces at the all-reduce's link, none of the copies.
  l.sequence_parallel = false;
  const double act = bytes / 10e9 + 2e-6;
  EXPECT_NEAR(predict(Workload{baby(), 12}, l, m).time.tp_comm, 4 * 4 * act + 2 * act + loss, 1e-12);
}

// Context parallelism: a rank computes on T/cp of each sequence (every op's tokens halved at cp 2, attention's
// queries against all T keys: half its work), its ring adds per block forward cp - 1 K|V sends and backward cp - 1
// more plus cp gradient blocks (all exposed on a CPU machine; on a GPU the K|V hops hide behind attention), and the
// gradients are averaged over dp x cp: dp 1 x cp 2 runs dp 2's collectives.
TEST(PredictStep, ContextParallelSplitsTheTokensAndAddsItsRing) {
  const Workload w{baby(), 12};
  Machine m = toy_machine();
  m.cpu = true;
  Layout one, cp2;
  cp2.cp = 2;
  const Prediction a = predict(w, one, m), b = predict(w, cp2, m);
  EXPECT_EQ(a.time.cp_comm, 0);
  EXPECT_NEAR(b.time.compute, a.time.compute / 2, 0.02 * a.time.compute);
  EXPECT_NEAR(b.compute_by_class.attention, a.compute_by_class.attention / 2, 1e-9 * a.compute_by_class.attention);
  // K|V of 12 sequences x 32 positions x 128 (4 heads of 32), f32; the gradient blocks are as big (f32 too).
  const double kv = point_to_point(2.0 * 12 * 32 * 128 * 4, m.intra);
  EXPECT_NEAR(b.time.cp_comm, 4 * (1 * kv + 1 * kv + 2 * kv), 1e-12);
  EXPECT_EQ(b.layout.gpus(), 2);
  Layout dp2;
  dp2.dp = 2;
  EXPECT_DOUBLE_EQ(b.dp_comm_total, predict(w, dp2, m).dp_comm_total);
  // Recomputing the block reruns its forward's sends.
  cp2.recompute = nn::Recompute::kBlock;
  EXPECT_NEAR(predict(w, cp2, m).time.cp_comm, 4 * (3 * kv + 2 * kv), 1e-12);
  // On a GPU the K|V hops hide behind each step's attention where it is longer; the gradients' never do.
  cp2.recompute = nn::Recompute::kNone;
  m.cpu = false;
  const Prediction gpu = predict(w, cp2, m);
  EXPECT_LT(gpu.time.cp_comm, b.time.cp_comm);
  EXPECT_GE(gpu.time.cp_comm, 4 * 2 * kv - 1e-12);
  Layout bad;
  bad.cp = 3;
  EXPECT_NE(refusal(w, bad).find("cp 3: the sequence 64 must be a multiple of 2 x cp"), std::string::npos);
  bad.cp = 2;
  bad.tp = 2;
  bad.sequence_parallel = true;
  EXPECT_NE(refusal(w, bad).find("cp with sequence parallelism"), std::string::npos);
}

TEST(PredictStep, RefusesWhatCannotRunNamingWhy) {
  const Workload w{baby(), 12};
  Layout l;
  l.tp = 3;
  EXPECT_NE(refusal(w, l).find("tp 3 does not divide the 4 heads"), std::string::npos);
  l = {};
  l.pp = 2;
  l.zero = 3;
  EXPECT_NE(refusal(w, l).find("ZeRO-3 with pp > 1"), std::string::npos);
  l = {};
  l.micro_batches = 5;
  EXPECT_NE(refusal(w, l).find("5 micro-batches do not divide the per-rank batch 12"), std::string::npos);
  l = {};
  l.pp = 8;
  EXPECT_NE(refusal(w, l).find("exceeds the 4 layers"), std::string::npos);
  EXPECT_THROW(predict(w, l, toy_machine()), Error);
}

TEST(PredictPlan, RanksByPredictedTimeAndSaysWhyOthersAreRefused) {
  // 2 GPUs with communication almost free: splitting the batch (dp 2) halves every op but the optimizer's, which
  // ZeRO halves at the price of its copies, so dp 2 with ZeRO comes first. tp 2 leaves the layer norms and the
  // stream replicated; sequence parallelism halves them but copies each collective's activation into the
  // sequence-major layout and back (4 bytes in and out per element, twice per collective, 10 collectives a block),
  // more than the halved layer norms save at the baby's width: without it tp 2 ranks higher. Every valid row is at
  // least as slow as the one before.
  Machine m = toy_machine();
  m.intra = m.inter = {0.0, 1e18};
  const Workload w{baby(), 12};
  const std::vector<PlanRow> rows = plan(w, 2, DType::f32, m, 1e12);
  ASSERT_FALSE(rows.empty());
  ASSERT_TRUE(rows[0].refused.empty());
  EXPECT_EQ(rows[0].layout.dp, 2);
  EXPECT_GT(rows[0].layout.zero, 0);
  auto first = [&](bool sp) {
    return std::find_if(rows.begin(), rows.end(),
                        [&](const PlanRow& r) { return r.layout.tp == 2 && r.layout.sequence_parallel == sp; });
  };
  EXPECT_LT(first(false), first(true));
  bool seen_refused = false, zero3_pp_refused = false;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (!rows[i].refused.empty()) {
      seen_refused = true;
      zero3_pp_refused |= rows[i].layout.zero == 3 && rows[i].layout.pp == 2 &&
                          rows[i].refused.find("ZeRO-3 with pp > 1") != std::string::npos;
      continue;
    }
    EXPECT_FALSE(seen_refused) << "valid rows come before the refused ones";
    EXPECT_LE(rows[i - 1].prediction.time.total(), rows[i].prediction.time.total());
  }
  EXPECT_TRUE(zero3_pp_refused);
  // A budget below any layout's needs refuses them all, saying so.
  for (const PlanRow& r : plan(w, 2, DType::f32, m, 1024)) EXPECT_FALSE(r.refused.empty()) << describe(r.layout);
}

}  // namespace
}  // namespace minidl::predict
