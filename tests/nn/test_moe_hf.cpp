// The oracle for the mixture of experts: transformers' own MixtralForCausalLM, loaded with from_pretrained from what
// minidl's save_gpt writes, runs the same batch (B 2 x T 64) in f32 with its router logits out
// (tests/nn/moe_hf_oracle.py). Over E 4 and 8, k 2 and 3, tied and untied, MHA and GQA: logits within 1e-4, router
// logits within 1e-6, the cross-entropy and the auxiliary loss within 1e-6 relative, every parameter's gradient of
// their sum within 1e-4 of its largest element, and 16 greedy tokens with minidl's KV cache equal to transformers'
// generate(do_sample=False). Then what save_pretrained wrote of that model loads into minidl bit for bit.
// Skipped, saying so, without the oracles' environment (scripts/install-deps.sh --with-oracles; CI has it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/node.h"
#include "nn/checkpoint.h"
#include "nn/hf_format.h"
#include "nn/llama.h"
#include "nn/moe.h"
#include "nn/safetensors.h"
#include "hf_oracle.h"
#include "support/run_program.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;

namespace {

struct Case {
  std::string name;
  GPTConfig cfg;
};

GPTConfig mixtral(int64_t experts, int64_t k, int64_t heads, int64_t kv, bool tied) {
  GPTConfig c{.vocab_size = 64, .block_size = 64, .n_layer = 2, .n_head = heads, .n_embd = 48, .bias = false};
  c.arch = GPTConfig::Arch::kLlama;
  c.n_kv_head = kv;
  c.intermediate_size = 40;
  c.norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_embeddings = tied;
  c.moe_experts = experts;
  c.moe_top_k = k;
  c.moe_aux_coef = 0.02;
  return c;
}

std::vector<Case> cases() {
  return {{"e4_k2_mha_tied", mixtral(4, 2, 4, 4, true)},
          {"e8_k2_gqa_untied", mixtral(8, 2, 6, 2, false)},
          {"e8_k3_mqa_tied", mixtral(8, 3, 4, 1, true)}};
}

void write_case(const Case& c, const std::string& dir) {
  std::filesystem::create_directories(dir);
  GPT m(c.cfg, 17);
  save_gpt(dir + "/model.safetensors", m, R"({"type": "gpt2"})");
  const Tensor ids = minidl::testing::random_ids(2, 64, 64, 3, 1),
               targets = minidl::testing::random_ids(2, 64, 64, 3, 2);
  Tensor loss = m.loss(ids, targets);
  const Tensor logits = m.forward(ids).detach();
  NamedTensors out = {{"logits", logits}, {"loss", loss.detach().reshape({1})}};
  double aux = 0;
  for (int64_t i = 0; i < c.cfg.n_layer; ++i) {
    const MoE& moe = *m.block<LlamaBlock>(size_t(i)).moe;
    aux += moe.last_aux_loss().item();
    out.emplace_back("router." + std::to_string(i), moe.last_router_logits());
  }
  out.emplace_back("aux", Tensor::from_vector(std::vector<double>{aux}, {1}));
  loss.backward();  // the cross-entropy's and, carried by each layer's output, the auxiliary loss's gradients
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor g = p.grad();
    out.emplace_back("grad." + hf_tensor_name(c.cfg, name),
                     hf_transposed(c.cfg, name) ? g.transpose(0, 1).contiguous() : g);
  }
  save_safetensors(dir + "/outputs.safetensors", out, {});
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21};
  const std::vector<int32_t> greedy = minidl::testing::greedy_tokens(m, prompt, 16, c.name);
  minidl::testing::write_ids(dir, ids, targets, prompt, greedy);
}

}  // namespace

TEST(MoEHF, TransformersMixtralComputesWhatMinidlComputes) {
  const std::string python = minidl::testing::oracle_python();
  if (python.empty()) GTEST_SKIP() << "no transformers: scripts/install-deps.sh --with-oracles installs it";
  minidl::testing::TempDir tmp;
  std::vector<std::string> dirs;
  for (const Case& c : cases()) {
    write_case(c, tmp.file(c.name));
    dirs.push_back(tmp.file(c.name));
  }
  std::printf("%-18s %11s %11s %10s %10s %10s %7s\n", "case", "logits |d|", "router |d|", "loss rel", "aux rel",
              "grad rel", "greedy");
  int checked = 0;
  for (const nlohmann::json& j : minidl::testing::run_oracle(python, "moe_hf_oracle.py", dirs)) {
    const std::string name = j.at("case");
    SCOPED_TRACE(name);
    ASSERT_FALSE(j.contains("error")) << j.dump();
    std::printf("%-18s %11.3g %11.3g %10.3g %10.3g %10.3g %7s\n", name.c_str(), j["logits_max_abs"].get<double>(),
                j["router_max_abs"].get<double>(), j["loss_rel"].get<double>(), j["aux_rel"].get<double>(),
                j["grad_max_rel"].get<double>(), j["greedy_equal"].get<bool>() ? "equal" : "DIFFER");
    EXPECT_LE(j["logits_max_abs"].get<double>(), 1e-4);
    EXPECT_LE(j["router_max_abs"].get<double>(), 1e-6);
    EXPECT_LE(j["loss_rel"].get<double>(), 1e-6);
    EXPECT_LE(j["aux_rel"].get<double>(), 1e-6);
    EXPECT_LE(j["grad_max_rel"].get<double>(), 1e-4) << j["grad_worst"];
    EXPECT_TRUE(j["missing"].empty()) << j["missing"].dump();
    EXPECT_TRUE(j["greedy_equal"].get<bool>()) << j["hf_greedy"].dump();
    for (const Case& c : cases()) {
      if (c.name != name) continue;
      const std::string saved = tmp.file(name) + "/hf_saved";
      EXPECT_EQ(load_gpt(saved).config, c.cfg) << "config.json as save_pretrained wrote it";
      GPT ours(c.cfg, 17), theirs(c.cfg, 18);
      load_into(theirs, saved);
      const NamedTensors a = ours.named_parameters(), b = theirs.named_parameters();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_vector(), b[i].second.to_vector()) << a[i].first;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}
