// The mixture-of-experts MLP (nn/moe.h): the routing arithmetic on golden cases (torchtitan's _permute cases among
// them), the layer against its dense twin and against a token-by-token reference, its gradients against finite
// differences, the auxiliary loss against its formula, the bias update, recomputation (bitwise, and counting each
// micro-batch once), and its refusals. The oracle against transformers' MixtralForCausalLM is test_moe_hf.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/rng.h"
#include "nn/checkpoint.h"
#include "nn/gpt.h"
#include "nn/hf_format.h"
#include "nn/llama.h"
#include "nn/moe.h"
#include "ops/cast.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;

namespace {

GPTConfig moe_config(int64_t experts = 4, int64_t k = 2) {
  GPTConfig c{.vocab_size = 29, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16, .bias = false};
  c.arch = GPTConfig::Arch::kLlama;
  c.intermediate_size = 24;
  c.moe_experts = experts;
  c.moe_top_k = k;
  return c;
}

Tensor ids_of(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  return minidl::testing::random_ids(B, T, V, 5, stream);
}

// N(0, scale) of `shape` from Philox(seed, stream), as dtype.
Tensor normal(const Shape& shape, uint64_t seed, uint64_t stream, DType dtype = DType::f32, double scale = 1.0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  Philox rng(seed, stream);
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * double(rng.normal(i));
  return Tensor::from_vector(v, shape, dtype);
}

bool bitwise(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

}  // namespace

// torchtitan's tests/unit_tests/test_moe.py cases for its _permute: rows arrive group-major (each peer's rows for
// expert 0, then expert 1) and are reordered expert-major.
TEST(MoERouting, ExpertMajorOrderGoldenCases) {
  EXPECT_EQ(expert_major_order({2, 3, 1, 4}, 2, 2), (std::vector<int64_t>{0, 1, 5, 2, 3, 4, 6, 7, 8, 9}));
  EXPECT_EQ(rows_per_expert({2, 3, 1, 4}, 2, 2), (std::vector<int64_t>{3, 7}));
  // an expert with no rows from one peer, and one with none at all
  EXPECT_EQ(expert_major_order({0, 2, 3, 0}, 2, 2), (std::vector<int64_t>{2, 3, 4, 0, 1}));
  EXPECT_EQ(expert_major_order({1, 0, 2, 0}, 2, 2), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(rows_per_expert({1, 0, 2, 0}, 2, 2), (std::vector<int64_t>{3, 0}));
  // all zero
  EXPECT_TRUE(expert_major_order({0, 0, 0, 0}, 2, 2).empty());
  // one group (one rank): already expert-major
  EXPECT_EQ(expert_major_order({2, 1, 3}, 1, 3), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // one expert: the groups' rows in group order
  EXPECT_EQ(expert_major_order({2, 3}, 2, 1), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(expert_major_order({1, 2, 3}, 2, 2), Error);
}

TEST(MoERouting, TopKTiesCapacityAndTheInverse) {
  // 3 tokens x 4 experts; token 1 ties experts 0 and 2 (the lower wins).
  const std::vector<double> s = {0.1, 0.4, 0.3, 0.2,  //
                                 0.3, 0.1, 0.3, 0.3,  //
                                 0.0, 0.5, 0.2, 0.3};
  Routing r = route(s, 3, 4, 2, -1);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2, 0, 2, 1, 3}));
  EXPECT_EQ(r.routed, (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(r.kept, r.routed);
  // expert-major: expert 0's slot 2; expert 1's slots 0, 4; expert 2's 1, 3; expert 3's 5
  EXPECT_EQ(r.order, (std::vector<int64_t>{2, 0, 4, 1, 3, 5}));
  for (size_t slot = 0; slot < r.row.size(); ++slot) EXPECT_EQ(r.order[size_t(r.row[slot])], int64_t(slot));
  // capacity 1: expert 1 keeps slot 0 (the earliest), drops slot 4; expert 2 keeps 1, drops 3
  r = route(s, 3, 4, 2, 1);
  EXPECT_EQ(r.kept, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(r.routed, (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(r.row, (std::vector<int64_t>{1, 2, 0, -1, -1, 3}));
  EXPECT_EQ(expert_capacity(1.0, 3, 2, 4), 2);  // ceil(6 / 4)
  // per sequence: tokens 0 and 1 form one, token 2 another; capacity 1 keeps slot 4 (expert 1) in the second
  r = route(s, 3, 4, 2, 1, 1);
  EXPECT_EQ(r.kept, r.routed);
  r = route({0.1, 0.4, 0.3, 0.2, 0.0, 0.5, 0.2, 0.3}, 2, 4, 2, 1, 2);  // one sequence of 2: token 1's expert 1 drops
  EXPECT_EQ(r.row, (std::vector<int64_t>{0, 1, -1, 2}));
  EXPECT_EQ(expert_capacity(0.0, 3, 2, 4), -1);
  EXPECT_THROW(route(s, 3, 4, 5, -1), Error);
}

// One expert, k = 1, no auxiliary loss: the gate is 1 and the dispatch the identity, so the MoE model computes its
// dense twin's function bit for bit, forward and backward.
TEST(MoE, OneExpertIsTheDenseMLPBitwise) {
  GPTConfig c = moe_config(1, 1);
  c.moe_balance = GPTConfig::Balance::kNone;
  GPTConfig dense = c;
  dense.moe_experts = 0;
  GPT m(c, 3), d(dense, 3);
  ASSERT_TRUE(m.block<LlamaBlock>(0).moe && !m.block<LlamaBlock>(0).mlp);
  const StateDict dw = d.state_dict();
  for (auto& [name, p] : m.named_parameters()) {
    std::string twin = name;
    if (const size_t at = twin.find("moe.experts.0."); at != std::string::npos) twin.replace(at, 14, "mlp.");
    if (twin.find(".moe.router.") != std::string::npos) continue;  // one expert: the gate is 1 whatever it says
    ASSERT_TRUE(dw.count(twin)) << twin;
    p.detach().copy_(dw.at(twin));
  }
  const Tensor ids = ids_of(2, 16, 29, 1), y = ids_of(2, 16, 29, 2);
  Tensor lm = m.loss(ids, y), ld = d.loss(ids, y);
  EXPECT_TRUE(bitwise(lm, ld));
  lm.backward();
  ld.backward();
  EXPECT_TRUE(
      bitwise(m.block<LlamaBlock>(0).attn->q_proj->weight.grad(), d.block<LlamaBlock>(0).attn->q_proj->weight.grad()));
  EXPECT_TRUE(bitwise((*m.block<LlamaBlock>(1).moe->experts)[0].c_proj->weight.grad(),
                      d.block<LlamaBlock>(1).mlp->c_proj->weight.grad()));
}

// An expert no token chose (a router biased away from it, and a capacity that drops everything) still runs, on no
// rows: its parameters get zero gradients, as data parallelism's buckets expect of every parameter.
TEST(MoE, AnExpertWithoutTokensGetsZeroGradients) {
  GPTConfig c = moe_config(4, 1);
  c.moe_balance = GPTConfig::Balance::kBias;
  GPT m(c, 3);
  for (MoE* moe : moe_layers(m)) moe->expert_bias.copy_(Tensor::from_vector(std::vector<double>{0, 9, 9, 9}, {4}));
  Tensor loss = m.loss(ids_of(2, 16, 29, 1), ids_of(2, 16, 29, 2));
  loss.backward();
  for (MoE* moe : moe_layers(m)) {
    const std::vector<int64_t> kept = moe->last_routing().kept;  // bias 9 on experts 1, 2, 3: none chooses 0
    EXPECT_EQ(kept[0], 0);
    EXPECT_EQ(kept[1] + kept[2] + kept[3], 32);
    const Tensor g = (*moe->experts)[0].gate_proj->weight.grad();
    ASSERT_TRUE(g.defined());
    for (double v : g.to_vector()) ASSERT_EQ(v, 0.0);
    EXPECT_EQ(moe->take_counts().routed, std::vector<double>(kept.begin(), kept.end()));  // once per backward
  }
}

// The layer against a token-by-token reference written from the formula (top k of the softmax, renormalised,
// each chosen expert's SwiGLU weighted), with a shared expert and a capacity that drops slots.
TEST(MoE, ForwardIsTheFormulaTokenByToken) {
  for (double capacity : {0.0, 0.5}) {
    SCOPED_TRACE(capacity);
    GPTConfig c = moe_config(4, 2);
    c.moe_shared = 1;
    c.moe_capacity = capacity;
    GPT m(c, 5);
    const MoE& moe = *m.block<LlamaBlock>(0).moe;
    const Tensor x = normal({2, 8, 16}, 9, 1);
    const Tensor y = moe.forward(x);
    const Routing& r = moe.last_routing();
    if (capacity > 0) {
      int64_t kept = 0;
      for (int64_t n : r.kept) kept += n;
      EXPECT_LT(kept, 2 * 8 * 2) << "capacity 0.5 drops slots";
      for (int64_t n : r.kept) EXPECT_LE(n, 2 * expert_capacity(0.5, 8, 2, 4));  // two sequences of 8
    }
    autograd::NoGradGuard no_grad;
    const Tensor xf = x.reshape({16, 16});
    const auto probs = softmax(matmul(xf, moe.router->weight)).to_vector();
    const Tensor shared = moe.shared->forward(xf);
    std::vector<double> want = shared.to_vector();
    for (int64_t t = 0; t < 16; ++t) {
      const int e0 = r.expert[size_t(2 * t)], e1 = r.expert[size_t(2 * t + 1)];
      const double p0 = probs[size_t(t * 4 + e0)], p1 = probs[size_t(t * 4 + e1)];
      EXPECT_GE(p0, p1);
      for (int j = 0; j < 2; ++j) {
        if (r.row[size_t(2 * t + j)] < 0) continue;  // dropped
        const int e = j == 0 ? e0 : e1;
        const double gate = (j == 0 ? p0 : p1) / (p0 + p1);
        const auto out = (*moe.experts)[size_t(e)].forward(xf.narrow(0, t, 1)).to_vector();
        for (int64_t i = 0; i < 16; ++i) want[size_t(t * 16 + i)] += gate * out[size_t(i)];
      }
    }
    const auto got = y.to_vector();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

// Gradients of sum(y * R) plus the auxiliary loss against central differences in f64, for the input, the router,
// an expert and the shared expert, under both routers. The step is small enough that no top-k choice flips.
TEST(MoE, GradientsMatchFiniteDifferences) {
  for (auto router : {GPTConfig::Router::kSoftmax, GPTConfig::Router::kSigmoid}) {
    SCOPED_TRACE(router == GPTConfig::Router::kSigmoid ? "sigmoid" : "softmax");
    GPTConfig c = moe_config(4, 2);
    c.moe_router = router;
    c.moe_shared = 1;
    c.moe_aux_coef = 0.5;  // large enough that a wrong auxiliary gradient shows
    MoE moe(c, 1, std::make_shared<DropoutContext>(), nullptr);
    for (auto& [name, p] : moe.named_parameters())
      p.set_data(normal(p.shape(), 3, uint64_t(name.size()), DType::f64, 0.3));
    Tensor x = normal({2, 4, 16}, 4, 1, DType::f64);
    x.set_requires_grad(true);
    const Tensor R = normal({2, 4, 16}, 4, 2, DType::f64);
    sum(moe.forward(x) * R).backward();
    for (const Tensor& w : {x, moe.router->weight, (*moe.experts)[1].up_proj->weight, moe.shared->c_proj->weight}) {
      const auto g = w.grad().to_vector();
      for (int64_t i : {int64_t(0), w.numel() / 3, w.numel() - 1}) {
        auto at = [&](double d) {
          Tensor flat = w.detach().reshape({w.numel()});
          const double v = flat.narrow(0, i, 1).item();
          flat.narrow(0, i, 1).fill_(v + d);
          autograd::NoGradGuard ng;
          const double l = sum(moe.forward(x.detach()) * R).item() + moe.last_aux_loss().item();
          flat.narrow(0, i, 1).fill_(v);
          return l;
        };
        const double h = 1e-6, numeric = (at(h) - at(-h)) / (2 * h);
        EXPECT_NEAR(g[size_t(i)], numeric, 1e-7 + 1e-6 * std::abs(numeric)) << i;
      }
    }
  }
}

// Under autocast the experts run in 16-bit but the router does not: its logits are the f32 product of the 16-bit
// activations (widened exactly) and the f32 weight, so near-tied experts are chosen as in f32.
TEST(MoE, TheRouterRunsInF32UnderAutocast) {
  GPTConfig c = moe_config(4, 2);
  MoE moe(c, 1, std::make_shared<DropoutContext>(), nullptr);
  for (auto& [name, p] : moe.named_parameters())
    p.set_data(normal(p.shape(), 5, uint64_t(name.size()), DType::f32, 0.3));
  const Tensor x = ops::cast(normal({2, 4, 16}, 6, 1), DType::bf16);
  Tensor y;
  {
    autograd::AutocastGuard amp(DType::bf16);
    y = moe.forward(x);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  const Tensor logits = moe.last_router_logits();
  ASSERT_EQ(logits.dtype(), DType::f32);
  autograd::NoGradGuard no_grad;
  const Tensor want = matmul(ops::cast(x, DType::f32).reshape({8, 16}), moe.router->weight);
  EXPECT_TRUE(bitwise(logits, want));
}

// FLOPs count the router and k of the E routed experts per token: the dense twin's count, its MLPs' 3·C·I
// parameters replaced by the router's C·E and k experts' 3·C·I each (times 6: forward and backward).
TEST(MoE, FlopsCountTheRouterAndKExperts) {
  GPTConfig c = moe_config(4, 2);
  GPTConfig dense = c;
  dense.moe_experts = 0;
  const double C = 16, I = 24, E = 4, k = 2, layers = 2;
  const double want = GPT(dense, 1).flops_per_token(16) + 6 * layers * (C * E + (k - 1) * 3 * C * I);
  EXPECT_DOUBLE_EQ(GPT(c, 1).flops_per_token(16), want);
}
