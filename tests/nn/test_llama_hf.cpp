// The oracle: transformers' own LlamaForCausalLM (and GPT2LMHeadModel), loaded with from_pretrained from what
// minidl's save_gpt writes, runs the same batch (B 2 x T 256) in f32 (tests/nn/llama_hf_oracle.py). Over a matrix of
// shapes (MHA, GQA 3:1, MQA; tied and untied; theta 1e4, 1e5, 5e5; linear and llama3 rope_scaling, llama3 with a
// short original context so that its three bands act at T 256) the logits agree within 1e-4, the loss within 1e-6
// relative, every parameter's gradient within 1e-4 of its largest element, and 32 greedy tokens with minidl's KV
// cache equal transformers' generate(do_sample=False) and minidl's own uncached argmax. Then the other direction:
// what transformers' save_pretrained wrote from that model loads into minidl (load_into on the folder) bit for bit,
// from one file and from shards, and from bf16 tensors as their values widened.
// Skipped, saying so, without the oracles' environment (scripts/install-deps.sh --with-oracles; CI has it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/node.h"
#include "core/rng.h"
#include "nn/checkpoint.h"
#include "nn/hf_format.h"
#include "nn/safetensors.h"
#include "ops/cast.h"
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

GPTConfig base_llama(int64_t heads, int64_t kv, bool tied, double theta, int64_t width = 64) {
  GPTConfig c{.vocab_size = 64, .block_size = 256, .n_layer = 2, .n_head = heads, .n_embd = width, .bias = false};
  c.arch = GPTConfig::Arch::kLlama;
  c.n_kv_head = kv;
  c.intermediate_size = 96;
  c.norm_eps = 1e-6;  // not the default 1e-5: a model that ignores the config's eps shows it
  c.rope_theta = theta;
  c.tie_embeddings = tied;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out = {{"mha_tied_1e4", base_llama(4, 4, true, 1e4)},
                           {"gqa3_untied_1e5", base_llama(6, 2, false, 1e5, 96)},
                           {"mqa_tied_5e5", base_llama(4, 1, true, 5e5)}};
  GPTConfig linear = base_llama(4, 2, false, 1e4);
  linear.rope_scaling = {ops::RopeType::kLinear, 2.0};
  out.push_back({"gqa2_linear2", linear});
  GPTConfig l3 = base_llama(4, 2, true, 5e5);
  l3.rope_scaling = {ops::RopeType::kLlama3, 8.0, 1.0, 4.0, 64};
  out.push_back({"gqa2_llama3_orig64", l3});
  GPTConfig wide = base_llama(4, 2, false, 1e4);
  wide.head_dim = 32;  // 4 x 32 = 128 != 64
  out.push_back({"head_dim32_width64", wide});
  out.push_back({"gpt2", GPTConfig{.vocab_size = 64, .block_size = 256, .n_layer = 2, .n_head = 4, .n_embd = 64}});
  return out;
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  return minidl::testing::random_ids(B, T, V, 3, stream);
}

// Writes the case's folder: the model as --save writes it, the batch, and minidl's logits, loss and gradients.
void write_case(const Case& c, const std::string& dir) {
  std::filesystem::create_directories(dir);
  GPT m(c.cfg, 11);
  save_gpt(dir + "/model.safetensors", m, R"({"type": "gpt2"})");
  const Tensor ids = random_ids(2, 256, c.cfg.vocab_size, 1), targets = random_ids(2, 256, c.cfg.vocab_size, 2);
  const Tensor logits = m.forward(ids).detach();
  Tensor loss = m.loss(ids, targets);
  loss.backward();
  NamedTensors out = {{"logits", logits}, {"loss", loss.detach().reshape({1})}};
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor g = p.grad();
    out.emplace_back("grad." + hf_tensor_name(c.cfg, name),
                     hf_transposed(c.cfg, name) ? g.transpose(0, 1).contiguous() : g);
  }
  save_safetensors(dir + "/outputs.safetensors", out, {});
  // Greedy: 32 tokens after an 8-token prompt, with the cache, each checked against the uncached argmax.
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29};
  const std::vector<int32_t> greedy = minidl::testing::greedy_tokens(m, prompt, 32, c.name);
  minidl::testing::write_ids(dir, ids, targets, prompt, greedy);
}

}  // namespace

TEST(LlamaHF, TransformersComputesWhatMinidlComputes) {
  const std::string python = minidl::testing::oracle_python();
  if (python.empty()) GTEST_SKIP() << "no transformers: scripts/install-deps.sh --with-oracles installs it";
  minidl::testing::TempDir tmp;
  std::vector<std::string> dirs;
  for (const Case& c : cases()) {
    write_case(c, tmp.file(c.name));
    dirs.push_back(tmp.file(c.name));
  }
  std::printf("%-20s %-9s %12s %10s %10s %7s\n", "case", "rope", "logits |d|", "loss rel", "grad rel", "greedy");
  int checked = 0;
  for (const nlohmann::json& j : minidl::testing::run_oracle(python, "llama_hf_oracle.py", dirs)) {
    const std::string name = j.at("case");
    SCOPED_TRACE(name);
    if (j.contains("skipped")) {
      std::printf("%-20s skipped: %s\n", name.c_str(), j["skipped"].get<std::string>().c_str());
      continue;
    }
    ASSERT_FALSE(j.contains("error")) << j.dump();
    std::printf("%-20s %-9s %12.3g %10.3g %10.3g %7s\n", name.c_str(), j["rope"].get<std::string>().c_str(),
                j["logits_max_abs"].get<double>(), j["loss_rel"].get<double>(), j["grad_max_rel"].get<double>(),
                j["greedy_equal"].get<bool>() ? "equal" : "DIFFER");
    EXPECT_LE(j["logits_max_abs"].get<double>(), 1e-4);
    EXPECT_LE(j["loss_rel"].get<double>(), 1e-6);
    EXPECT_LE(j["grad_max_rel"].get<double>(), 1e-4) << j["grad_worst"];
    EXPECT_TRUE(j["missing"].empty()) << j["missing"].dump();
    EXPECT_TRUE(j["greedy_equal"].get<bool>()) << j["hf_greedy"].dump();
    // The other direction: transformers' save_pretrained of that model, read by minidl: bit for bit from one file
    // and from shards (model.safetensors.index.json), and from bf16 tensors each minidl's value rounded to bf16.
    for (const Case& c : cases()) {
      if (c.name != name) continue;
      for (const std::string folder : {"hf_saved", "hf_sharded", "hf_bf16"}) {
        SCOPED_TRACE(folder);
        const std::string saved = tmp.file(name) + "/" + folder;
        ASSERT_TRUE(std::filesystem::exists(saved + "/config.json")) << saved;
        EXPECT_EQ(load_gpt(saved).config, c.cfg) << "config.json as save_pretrained wrote it";
        EXPECT_EQ(std::filesystem::exists(saved + "/model.safetensors.index.json"), folder == "hf_sharded");
        GPT ours(c.cfg, 11), theirs(c.cfg, 12);
        load_into(theirs, saved);
        const NamedTensors a = ours.named_parameters(), b = theirs.named_parameters();
        for (size_t i = 0; i < a.size(); ++i) {
          const Tensor& mine = a[i].second;
          const Tensor want = folder == "hf_bf16" ? ops::cast(ops::cast(mine, DType::bf16), DType::f32) : mine;
          EXPECT_EQ(want.to_vector(), b[i].second.to_vector()) << a[i].first;
        }
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 6);
}
