// The predictor's mixture of experts and expert parallelism against independent counts: the model's own parameters
// and FLOPs (nn::GPT built from the same configuration), the dense MLP an expert is, and the all-to-alls term by
// term from dist/expert_parallel.cpp's exchange.
#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "predict/collectives.h"
#include "predict/compute.h"
#include "predict/predict.h"
#include "tests/predict/fixtures.h"
#include "train/zero_memory.h"

namespace minidl::predict {
namespace {

using testing::toy_machine;

// The baby Llama (4 blocks, C 128, 4 heads, I 512, T 64) with E experts of top-k in every `every`-th block.
nn::GPTConfig moe_llama(int64_t experts, int64_t k, int64_t every = 1, int64_t shared = 0) {
  nn::GPTConfig c{65, 64, 4, 4, 128, 0.0, true};
  c.arch = nn::GPTConfig::Arch::kLlama;
  c.bias = false;
  c.moe_experts = experts, c.moe_top_k = k, c.moe_every = every, c.moe_shared = shared;
  return c;
}

double gemm_flops(const std::vector<OpCost>& ops) {
  double f = 0;
  for (const OpCost& op : ops) f += op.cls == OpClass::kGemm ? op.flops : 0;
  return f;
}

// The parameters the memory model counts are the model's own, MoE blocks and all; E / ep experts a rank under ep.
TEST(PredictMoE, ParametersAndFlopsAreTheModelsOwn) {
  for (const nn::GPTConfig& c : {moe_llama(0, 2), moe_llama(4, 2), moe_llama(4, 1, 2, 1), moe_llama(8, 3, 3, 2)}) {
    SCOPED_TRACE(c.moe_experts);
    const nn::GPT model(c);
    const train::MemoryPlan p = train::predict_memory({c});
    EXPECT_DOUBLE_EQ(p.persistent + p.blocks, double(model.num_parameters()));
    EXPECT_NEAR(model_flops_per_token(c, 64), model.flops_per_token(64), 1e-9 * model.flops_per_token(64));
    if (!c.moe()) continue;
    const train::MemoryPlan half = train::predict_memory({.model = c, .ep = 2});
    double held = 0;  // the experts a rank no longer holds at ep 2: half of each MoE block's
    for (int64_t i = 0; i < c.n_layer; ++i) held += c.moe_layer(i) ? double(c.moe_experts / 2) * 3 * 128 * 512 : 0;
    EXPECT_DOUBLE_EQ(p.blocks - half.blocks, held);
  }
}

// One expert chosen by every token is the dense MLP: its products are the dense block's, plus the router's.
TEST(PredictMoE, OneExpertOfTopOneIsTheDenseMlpAndARouter) {
  const nn::GPTConfig dense = moe_llama(0, 2), one = moe_llama(1, 1);
  ComputeQuery d{dense};
  d.micro_batch = 12;
  ComputeQuery m = d;
  m.model = one;
  m.moe_block = true;
  const double BT = 12 * 64;
  EXPECT_DOUBLE_EQ(gemm_flops(block_forward_ops(m)), gemm_flops(block_forward_ops(d)) + 2 * BT * 128 * 1);
  EXPECT_DOUBLE_EQ(gemm_flops(block_backward_ops(m)), gemm_flops(block_backward_ops(d)) + 2 * 2 * BT * 128 * 1);
  // A dense block of an MoE model (moe_block false) is the dense block.
  m.moe_block = false;
  EXPECT_DOUBLE_EQ(gemm_flops(block_forward_ops(m)), gemm_flops(block_forward_ops(d)));
  // k of E experts: k times the MLP's products; the capacity keeps ceil(F T k / E) rows per expert and sequence.
  ComputeQuery k2 = d;
  k2.model = moe_llama(4, 2);
  k2.moe_block = true;
  EXPECT_DOUBLE_EQ(moe_rows(k2), BT * 2);
  k2.model.moe_capacity = 0.5;
  EXPECT_DOUBLE_EQ(moe_rows(k2), 12 * 4 * 16);  // ceil(0.5 x 64 x 2 / 4) = 16 slots per expert and sequence
  k2.model.moe_capacity = 1.0;
  EXPECT_DOUBLE_EQ(moe_rows(k2), BT * 2);  // a balanced router drops nothing at F 1
}

// Expert parallelism: per MoE block and micro-batch, forward the counts (E f64 values) and the rows out and home,
// backward the rows' gradients both ways, each a pairwise all-to-all over the ep group; recomputing the block
// repeats the forward's. The experts' gradients then all-reduce over the dp / ep ranks holding them: none at
// dp = ep, so the dp traffic falls by the experts' share.
TEST(PredictMoE, ExpertParallelismAddsItsAllToAllsTermByTerm) {
  const Workload w{moe_llama(4, 2, 2), 24};  // MoE blocks 0 and 2
  Machine m = toy_machine();
  m.cpu = true;
  Layout dp2, ep2;
  dp2.dp = ep2.dp = 2;
  ep2.ep = 2;
  const Prediction a = predict(w, dp2, m), b = predict(w, ep2, m);
  EXPECT_EQ(a.time.ep_comm, 0);
  const double rows = all_to_all(2, 12.0 * 64 * 2 * 128 * 4, m.intra), counts = all_to_all(2, 8.0 * 4, m.intra);
  EXPECT_NEAR(b.time.ep_comm, 2 * (counts + 2 * rows + 2 * rows), 1e-12);
  EXPECT_EQ(all_to_all(2, 1e6, m.intra), 0.5e6 / 10e9 + 1e-6);  // (n - 1)/n S/beta + (n - 1) alpha
  EXPECT_LT(b.dp_comm_total, a.dp_comm_total);
  EXPECT_LT(b.memory_peak, a.memory_peak);
  EXPECT_EQ(b.layout.gpus(), 2);
  ep2.recompute = nn::Recompute::kBlock;
  EXPECT_NEAR(predict(w, ep2, m).time.ep_comm, 2 * (2 * (counts + 2 * rows) + 2 * rows), 1e-12);
  // The compute is dp 2's but for the arrived rows' permutation and back, memory-bound copies.
  EXPECT_GT(b.time.compute, a.time.compute);
  EXPECT_NEAR(b.compute_by_class.gemm, a.compute_by_class.gemm, 1e-9 * a.compute_by_class.gemm);
  Layout bad = ep2;
  bad.ep = 3, bad.dp = 3;
  EXPECT_NE(refusal({moe_llama(4, 2), 24}, bad).find("ep 3 must divide the 4 experts"), std::string::npos);
  bad = ep2;
  bad.zero = 1;
  EXPECT_NE(refusal(w, bad).find("ep with ZeRO or pp"), std::string::npos);
  bad = ep2;
  EXPECT_NE(refusal({moe_llama(0, 2), 24}, bad).find("expert parallelism spreads"), std::string::npos);
}

}  // namespace
}  // namespace minidl::predict
