// The Llama architecture of nn::GPT (nn/llama.h): its tree of parameters, what it shares with GPT-2's code paths
// (recomputation bitwise, the KV cache equal to recomputing, stages), its FLOPs counted by hand for SmolLM2's
// shape, its files (minidl's own under HF's names and layouts, read back bitwise), and its refusals. The oracle
// against transformers' LlamaForCausalLM is test_llama_hf.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "autograd/node.h"
#include "core/rng.h"
#include "nn/checkpoint.h"
#include "nn/gpt.h"
#include "nn/hf_format.h"
#include "nn/llama.h"
#include "nn/safetensors.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;

namespace {

GPTConfig llama(int64_t kv = 2, bool tied = true) {
  GPTConfig c{.vocab_size = 37, .block_size = 48, .n_layer = 2, .n_head = 6, .n_embd = 48, .bias = false};
  c.arch = GPTConfig::Arch::kLlama;
  c.n_kv_head = kv;
  c.intermediate_size = 80;
  c.norm_eps = 1e-6;
  c.rope_theta = 1e5;
  c.tie_embeddings = tied;
  return c;
}

Tensor ids_of(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  return minidl::testing::random_ids(B, T, V, 7, stream);
}

bool bitwise(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

}  // namespace

TEST(Llama, ParametersAreLlamasUnderMinidlsNames) {
  GPT m(llama(2, /*tied=*/false), 1);
  const NamedTensors p = m.named_parameters();
  std::vector<std::string> names;
  for (const auto& [n, t] : p) names.push_back(n);
  const std::vector<std::string> block = {"ln_1.weight",          "attn.q_proj.weight", "attn.k_proj.weight",
                                          "attn.v_proj.weight",   "attn.c_proj.weight", "ln_2.weight",
                                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.c_proj.weight"};
  std::vector<std::string> want = {"transformer.wte.weight"};
  for (int i = 0; i < 2; ++i)
    for (const auto& b : block) want.push_back("transformer.h." + std::to_string(i) + "." + b);
  want.push_back("transformer.ln_f.weight");
  want.push_back("lm_head.weight");
  EXPECT_EQ(names, want);
  const auto& b = m.block<LlamaBlock>(0);
  EXPECT_EQ(b.attn->q_proj->weight.shape(), (Shape{48, 48}));
  EXPECT_EQ(b.attn->k_proj->weight.shape(), (Shape{48, 16}));  // 2 kv heads of 8
  EXPECT_EQ(b.mlp->gate_proj->weight.shape(), (Shape{48, 80}));
  EXPECT_EQ(b.mlp->c_proj->weight.shape(), (Shape{80, 48}));
  EXPECT_EQ(m.lm_head->weight.shape(), (Shape{37, 48}));
  EXPECT_FALSE(m.wpe) << "rotary positions: no position table";
  for (const auto& [n, t] : p)
    if (t.dim() == 1) EXPECT_EQ(t.to_vector(), std::vector<double>(size_t(t.numel()), 1.0)) << n;
}

// Recomputation changes when, not what: every setting's loss and gradients are bitwise the plain run's.
TEST(Llama, RecomputeIsBitwise) {
  const GPTConfig cfg = llama();
  const Tensor ids = ids_of(2, 16, cfg.vocab_size, 1), targets = ids_of(2, 16, cfg.vocab_size, 2);
  std::vector<std::vector<Tensor>> grads;
  std::vector<double> losses;
  for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kMlp, Recompute::kBlock}) {
    GPT m(cfg, 3);
    m.set_recompute(r);
    Tensor loss = m.loss(ids, targets);
    loss.backward();
    losses.push_back(loss.item());
    std::vector<Tensor> g;
    for (const Tensor& p : m.parameters()) g.push_back(p.grad());
    grads.push_back(g);
  }
  for (size_t r = 1; r < grads.size(); ++r) {
    EXPECT_EQ(losses[r], losses[0]) << recompute_name(Recompute(r));
    for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(bitwise(grads[r][i], grads[0][i])) << r << " " << i;
  }
}

// Greedy tokens with the cache equal recomputing the whole prefix each time, for MHA, GQA and MQA; the cache keeps
// n_kv_head heads.
TEST(Llama, CachedGenerationEqualsRecomputing) {
  for (int64_t kv : {6, 2, 1}) {
    SCOPED_TRACE("kv heads " + std::to_string(kv));
    GPT m(llama(kv), 5);
    m.eval();
    autograd::NoGradGuard no_grad;
    std::vector<int32_t> seq = {3, 14, 15, 9, 2, 6};
    KVCache cache;
    Tensor logits = m.forward_cached(Tensor::from_vector(seq, {1, int64_t(seq.size())}), cache);
    EXPECT_TRUE(bitwise(logits, m.forward(Tensor::from_vector(seq, {1, int64_t(seq.size())}))))
        << "the first call is forward()'s arithmetic";
    std::vector<int32_t> recomputed = seq;
    for (int step = 0; step < 20; ++step) {
      const int64_t V = m.config().vocab_size;
      auto argmax_last = [&](const Tensor& l) {
        const auto v = l.to_vector();
        const size_t base = v.size() - size_t(V);
        return int32_t(std::max_element(v.begin() + long(base), v.end()) - (v.begin() + long(base)));
      };
      const int32_t next = argmax_last(logits);
      const Tensor whole = m.forward(Tensor::from_vector(recomputed, {1, int64_t(recomputed.size())}));
      ASSERT_EQ(next, argmax_last(whole)) << "step " << step;
      recomputed.push_back(next);
      logits = m.forward_cached(Tensor::from_vector(std::vector<int32_t>{next}, {1, 1}), cache);
    }
    EXPECT_EQ(cache.blocks[0].k_t.size(0), kv);
    EXPECT_EQ(cache.blocks[0].v.shape(), (Shape{kv, 48, 8}));
  }
}

// A pipeline's chunks are the whole model's pieces: losses and gradients bitwise, the untied head on the last.
TEST(Llama, StagesComposeToTheWholeModel) {
  const GPTConfig cfg = llama(2, /*tied=*/false);
  const Tensor ids = ids_of(2, 12, cfg.vocab_size, 3), targets = ids_of(2, 12, cfg.vocab_size, 4);
  GPT whole(cfg, 9), first(cfg, 9, {.first_block = 0, .last_block = 1, .head = false}),
      last(cfg, 9, {.first_block = 1, .embedding = false});
  EXPECT_FALSE(last.wte) << "an untied head's stage holds lm_head, not wte";
  const double want = whole.loss(ids, targets).item();
  const double got = last.head_loss(last.blocks(1, 2, first.blocks(0, 1, first.embed(ids))), targets).item();
  EXPECT_EQ(got, want);
}

// SmolLM2-135M's shape (576 wide, 9 heads, 3 kv heads of 64, SwiGLU 1536, tied 49152 vocabulary) with 2 of its 30
// layers: FLOPs per token counted by hand.
TEST(Llama, FlopsCountSwiGLUAndGroupedQueryProjections) {
  GPTConfig c{.vocab_size = 49152, .block_size = 64, .n_layer = 2, .n_head = 9, .n_embd = 576, .bias = false};
  c.arch = GPTConfig::Arch::kLlama;
  c.n_kv_head = 3;
  c.intermediate_size = 1536;
  c.rope_theta = 1e5;
  GPT m(c, 0);
  const double C = 576, H = 9, KV = 3, D = 64, I = 1536, V = 49152, L = 2, T = 64;
  const double per_layer = 2 * C + C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I;  // norms, q, k+v, o, MLP
  const double N = V * C + L * per_layer + C;                                           // + tied table, ln_f
  EXPECT_EQ(double(m.num_parameters()), N);
  EXPECT_EQ(m.flops_per_token(64), 6 * N + 12 * L * H * D * T);
  c.tie_embeddings = false;
  GPT untied(c, 0);
  EXPECT_EQ(double(untied.num_parameters()), N + V * C);
  EXPECT_EQ(untied.flops_per_token(64), 6 * N + 12 * L * H * D * T)
      << "untied: lm_head multiplies, the embedding only looks up (its count leaves)";
}

// --save's file is LlamaForCausalLM's (HF names, (out, in) weights, config.json); reading it back is bitwise.
TEST(Llama, FileUsesHuggingFaceNamesAndReadsBackBitwise) {
  const auto dir = std::filesystem::temp_directory_path() / ("minidl_llama_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const GPTConfig cfg = llama(2, false);
  GPT m(cfg, 4);
  const std::string path = (dir / "model.safetensors").string();
  save_gpt(path, m, R"({"type": "gpt2"})");
  const SafetensorsFile f = load_safetensors(path);
  ASSERT_TRUE(f.tensors.count("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_EQ(f.tensors.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{16, 48})) << "(out, in)";
  EXPECT_TRUE(f.tensors.count("model.embed_tokens.weight") && f.tensors.count("lm_head.weight") &&
              f.tensors.count("model.layers.0.mlp.down_proj.weight") && f.tensors.count("model.norm.weight"));
  EXPECT_EQ(load_gpt(path).config, cfg);
  EXPECT_EQ(config_from_hf_json(hf_config_json(cfg), "config.json"), cfg) << hf_config_json(cfg);
  GPT back(cfg, 99);
  load_into(back, path);
  const NamedTensors a = m.named_parameters(), b = back.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise(a[i].second, b[i].second)) << a[i].first;
  GPT from_folder(cfg, 98);
  load_into(from_folder, dir.string());  // the folder, as from_pretrained reads it
  EXPECT_TRUE(bitwise(from_folder.named_parameters()[3].second, a[3].second));
  std::filesystem::remove_all(dir);
}

TEST(Llama, BadConfigsAreRefusedByName) {
  auto refused = [](GPTConfig c, const std::string& needle) {
    try {
      c.validate();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted; expected an error with: " << needle;
  };
  GPTConfig c = llama();
  c.n_kv_head = 4;
  refused(c, "num_attention_heads (6) must be a multiple of num_key_value_heads (4)");
  c = llama();
  c.n_embd = 50;
  refused(c, "n_embd must be a positive multiple of n_head (6) unless head_dim is given");
  c.head_dim = 8;
  EXPECT_NO_THROW(c.validate()) << "an explicit head_dim frees the width";
  c.head_dim = 7;
  refused(c, "RoPE needs an even head_dim");
  GPTConfig g{.vocab_size = 5, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8};
  g.n_kv_head = 1;
  refused(g, "need arch llama");

  const std::string base = hf_config_json(llama());
  auto hf_refused = [&](const std::string& from, const std::string& to, const std::string& needle,
                        std::string text = "") {
    if (text.empty()) text = base;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      config_from_hf_json(text, "dir/config.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); }
  };
  hf_refused(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})",
             "unknown rope_type 'yarn'; supported: default, linear, llama3");
  hf_refused(R"("num_key_value_heads": 2)", R"("num_key_value_heads": 4)",
             "must be a multiple of num_key_value_heads (4)");
  std::string no_head_dim = base;
  no_head_dim.erase(no_head_dim.find(R"("head_dim": 8,)"), std::string(R"("head_dim": 8,)").size());
  hf_refused(R"("hidden_size": 48)", R"("hidden_size": 50)", "hidden_size 50 is not divisible by num_attention_heads 6",
             no_head_dim);
  hf_refused(R"("model_type": "llama")", R"("model_type": "mistral")",
             "expected gpt2, llama or mixtral, got 'mistral'");
}

// A file that lacks a tensor, or holds one of another shape, is refused naming it (and both shapes).
TEST(Llama, MissingOrMisshapedTensorsAreNamed) {
  const auto dir = std::filesystem::temp_directory_path() / ("minidl_llama_bad_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const GPTConfig cfg = llama();
  GPT m(cfg, 1);
  NamedTensors t;
  for (const auto& [n, p] : m.named_parameters())
    if (n != "transformer.h.1.ln_2.weight")
      t.emplace_back(hf_tensor_name(cfg, n), hf_transposed(cfg, n) ? p.transpose(0, 1).contiguous() : p);
  save_safetensors((dir / "model.safetensors").string(), t, {});
  try {
    load_into(m, dir.string());
    ADD_FAILURE() << "a missing tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.1.ln_2.weight"), std::string::npos) << e.what();
  }
  t.emplace_back("model.layers.1.post_attention_layernorm.weight", Tensor::ones({47}));
  save_safetensors((dir / "model.safetensors").string(), t, {});
  try {
    load_into(m, dir.string());
    ADD_FAILURE() << "a misshaped tensor was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("47"), std::string::npos) << what;
    EXPECT_NE(what.find("48"), std::string::npos) << what;
  }
  std::filesystem::remove_all(dir);
}
