#include "nn/hf_format.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "nn/safetensors.h"
#include "ops/cast.h"

namespace minidl::nn {

namespace {

// minidl's Llama names -> HF's, one rule per part of a block (nn/hf_format.h's table).
const std::vector<std::pair<std::string, std::string>>& llama_block_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"ln_1.weight", "input_layernorm.weight"},         {"attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"attn.k_proj.weight", "self_attn.k_proj.weight"}, {"attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"attn.c_proj.weight", "self_attn.o_proj.weight"}, {"ln_2.weight", "post_attention_layernorm.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},  {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.c_proj.weight", "mlp.down_proj.weight"},
  };
  return names;
}

// An MoE block's tensors (MixtralSparseMoeBlock's names; the shared expert as Qwen2-MoE's), by the rest of the name
// after the block's index: ours -> theirs, or the reverse (to_hf false); "" where the name is not one of them.
std::string moe_name(const std::string& rest, bool to_hf) {
  static const std::vector<std::pair<std::string, std::string>> fixed = {
      {"moe.router.weight", "block_sparse_moe.gate.weight"},
      {"moe.expert_bias", "block_sparse_moe.gate.e_score_correction_bias"},  // DeepSeek-V3's name
      {"moe.shared.gate_proj.weight", "block_sparse_moe.shared_expert.gate_proj.weight"},
      {"moe.shared.up_proj.weight", "block_sparse_moe.shared_expert.up_proj.weight"},
      {"moe.shared.c_proj.weight", "block_sparse_moe.shared_expert.down_proj.weight"}};
  static const std::vector<std::pair<std::string, std::string>> expert = {
      {"gate_proj.weight", "w1.weight"}, {"up_proj.weight", "w3.weight"}, {"c_proj.weight", "w2.weight"}};
  for (const auto& [ours, theirs] : fixed)
    if (rest == (to_hf ? ours : theirs)) return to_hf ? theirs : ours;
  const std::string from = to_hf ? "moe.experts." : "block_sparse_moe.experts.";
  const std::string to = to_hf ? "block_sparse_moe.experts." : "moe.experts.";
  if (rest.rfind(from, 0) != 0) return "";
  const size_t dot = rest.find('.', from.size());
  if (dot == std::string::npos) return "";
  const std::string j = rest.substr(from.size(), dot - from.size()), tail = rest.substr(dot + 1);
  if (j.empty() || j.find_first_not_of("0123456789") != std::string::npos) return "";
  for (const auto& [ours, theirs] : expert)
    if (tail == (to_hf ? ours : theirs)) return to + j + "." + (to_hf ? theirs : ours);
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  MINIDL_CHECK(in.good(), "cannot read ", path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// `name` as prefix + <digits> + "." + rest: the block's index and the rest of the name (both empty if not).
std::pair<std::string, std::string> block_and_rest(const std::string& name, const std::string& prefix) {
  if (!starts_with(name, prefix)) return {};
  const size_t dot = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), dot == std::string::npos ? 0 : dot - prefix.size());
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return {};
  return {index, name.substr(dot + 1)};
}

}  // namespace

std::string hf_tensor_name(const GPTConfig& cfg, const std::string& name) {
  if (!cfg.llama()) return name;
  if (name == "transformer.wte.weight") return "model.embed_tokens.weight";
  if (name == "transformer.ln_f.weight") return "model.norm.weight";
  if (name == "lm_head.weight") return name;
  const auto [index, rest] = block_and_rest(name, "transformer.h.");
  for (const auto& [ours, theirs] : llama_block_names())
    if (!index.empty() && rest == ours) return "model.layers." + index + "." + theirs;
  const std::string moe = index.empty() ? "" : moe_name(rest, true);
  if (!moe.empty()) return "model.layers." + index + "." + moe;
  MINIDL_CHECK(false, "hf_tensor_name: ", name, " is not a Llama parameter");
  return name;
}

bool hf_transposed(const GPTConfig& cfg, const std::string& name) {
  if (!cfg.llama()) return false;
  // every Linear of a Llama block, and an MoE's router
  return name.find("_proj.weight") != std::string::npos || name.find(".moe.router.weight") != std::string::npos;
}

bool hf_expressible(const GPTConfig& c) {
  if (!c.moe()) return true;
  // (k = 1: Mixtral renormalises the one gate to 1; minidl keeps Switch's gate p, so the router learns)
  return c.moe_router == GPTConfig::Router::kSoftmax && c.moe_top_k > 1 && c.moe_balance != GPTConfig::Balance::kBias &&
         c.moe_every == 1 && c.moe_shared == 0 && c.moe_capacity == 0 && c.head_size() * c.n_head == c.n_embd &&
         c.rope_scaling.type == ops::RopeType::kNone;
}

std::string minidl_tensor_name(const GPTConfig& cfg, const std::string& hf) {
  auto ends_with = [&](const std::string& suffix) {
    return hf.size() >= suffix.size() && hf.compare(hf.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (hf == "lm_head.weight") return cfg.tie_embeddings ? "" : hf;  // a tied head is wte
  if (!cfg.llama()) {
    if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) return "";  // the causal mask's buffers
    return starts_with(hf, "transformer.") ? hf : "transformer." + hf;         // GPT2Model's names lack the prefix
  }
  if (ends_with("rotary_emb.inv_freq")) return "";  // a buffer older transformers saved
  if (hf == "model.embed_tokens.weight") return "transformer.wte.weight";
  if (hf == "model.norm.weight") return "transformer.ln_f.weight";
  const auto [index, rest] = block_and_rest(hf, "model.layers.");
  for (const auto& [ours, theirs] : llama_block_names())
    if (!index.empty() && rest == theirs) return "transformer.h." + index + "." + ours;
  const std::string moe = index.empty() || !cfg.moe() ? "" : moe_name(rest, false);
  if (!moe.empty()) return "transformer.h." + index + "." + moe;
  MINIDL_CHECK(false, "unexpected tensor ", hf, " for a Llama (LlamaForCausalLM's names: model.embed_tokens.weight, ",
               "model.layers.<i>.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight)");
  return "";
}

std::string hf_config_json(const GPTConfig& cfg) {
  if (!cfg.llama()) {
    nlohmann::ordered_json j = {
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"vocab_size", cfg.vocab_size},
        {"n_positions", cfg.block_size},
        {"n_embd", cfg.n_embd},
        {"n_layer", cfg.n_layer},
        {"n_head", cfg.n_head},
        {"n_inner", nullptr},                 // null means 4 * n_embd, as minidl's MLP
        {"activation_function", "gelu_new"},  // the tanh approximation
        {"resid_pdrop", cfg.dropout},
        {"embd_pdrop", cfg.dropout},
        {"attn_pdrop", 0.0},
        {"layer_norm_epsilon", 1e-5},
        {"tie_word_embeddings", true},
        {"bos_token_id", nullptr},
        {"eos_token_id", nullptr},
    };
    return j.dump(2) + "\n";
  }
  nlohmann::ordered_json scaling = nullptr;
  const ops::RopeScaling& r = cfg.rope_scaling;
  // Linear as {"type", "factor"} only: transformers before 4.43 refuse any other key, later ones read "type" too.
  if (r.type == ops::RopeType::kLinear) scaling = {{"type", "linear"}, {"factor", r.factor}};
  if (r.type == ops::RopeType::kLlama3)
    scaling = {{"rope_type", "llama3"},
               {"factor", r.factor},
               {"low_freq_factor", r.low_freq_factor},
               {"high_freq_factor", r.high_freq_factor},
               {"original_max_position_embeddings", r.original_max_position_embeddings}};
  nlohmann::ordered_json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", cfg.vocab_size},
      {"max_position_embeddings", cfg.block_size},
      {"hidden_size", cfg.n_embd},
      {"intermediate_size", cfg.mlp_width()},
      {"num_hidden_layers", cfg.n_layer},
      {"num_attention_heads", cfg.n_head},
      {"num_key_value_heads", cfg.kv_heads()},
      {"head_dim", cfg.head_size()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", cfg.norm_eps},
      {"rope_theta", cfg.rope_theta},
      {"rope_scaling", scaling},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"tie_word_embeddings", cfg.tie_embeddings},
      {"torch_dtype", "float32"},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
  };
  if (cfg.moe()) {  // Mixtral: Llama's fields but head_dim, rope_scaling and the biases' flags, and the experts'
    MINIDL_CHECK(
        hf_expressible(cfg), "hf_config_json: this mixture of experts is not a Mixtral (it needs the softmax ",
        "router with top_k > 1, every block MoE, no shared expert, no capacity, no bias balancing, head_dim = ",
        "hidden / heads and no rope_scaling)");
    for (const char* key : {"head_dim", "rope_scaling", "attention_bias", "mlp_bias"}) j.erase(key);
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["sliding_window"] = nullptr;
    j["num_local_experts"] = cfg.moe_experts;
    j["num_experts_per_tok"] = cfg.moe_top_k;
    j["router_aux_loss_coef"] = cfg.moe_balance == GPTConfig::Balance::kAux ? cfg.moe_aux_coef : 0.0;
    j["output_router_logits"] = false;
  }
  return j.dump(2) + "\n";
}

GPTConfig config_from_hf_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) { MINIDL_CHECK(false, source, ": not valid JSON (", e.what(), ")"); }
  MINIDL_CHECK(j.is_object(), source, ": expected a JSON object");
  const std::string type = j.value("model_type", "");
  auto field = [&](const char* key) -> const nlohmann::json& {
    MINIDL_CHECK(j.contains(key) && !j[key].is_null(), source, ": missing field \"", key, "\" (model_type ", type, ")");
    return j[key];
  };
  auto integer = [&](const char* key) {
    MINIDL_CHECK(field(key).is_number_integer(), source, ": field \"", key, "\" must be an integer, got ",
                 field(key).dump());
    return field(key).get<int64_t>();
  };
  GPTConfig cfg;
  try {
    if (type == "gpt2") {
      cfg.vocab_size = integer("vocab_size");
      cfg.block_size = integer("n_positions");
      cfg.n_layer = integer("n_layer");
      cfg.n_head = integer("n_head");
      cfg.n_embd = integer("n_embd");
      MINIDL_CHECK(!j.contains("n_inner") || j["n_inner"].is_null() || j["n_inner"] == 4 * cfg.n_embd, source,
                   ": field \"n_inner\" must be null or 4 * n_embd = ", 4 * cfg.n_embd, ", got ", j["n_inner"].dump());
      const std::string act = j.value("activation_function", "gelu_new");
      MINIDL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", source,
                   ": field \"activation_function\": expected gelu_new (the tanh GELU), got ", act);
      cfg.dropout = 0.0;
    } else if (type == "llama" || type == "mixtral") {
      cfg.arch = GPTConfig::Arch::kLlama;
      if (type == "mixtral") {
        cfg.moe_experts = integer("num_local_experts");
        cfg.moe_top_k = integer("num_experts_per_tok");
        cfg.moe_aux_coef = j.value("router_aux_loss_coef", 0.001);
        MINIDL_CHECK(j.value("sliding_window", nlohmann::json()).is_null(), source,
                     ": field \"sliding_window\": expected null (minidl's attention is over the whole sequence), got ",
                     j["sliding_window"].dump());
      }
      cfg.bias = false;
      cfg.vocab_size = integer("vocab_size");
      cfg.block_size = integer("max_position_embeddings");
      cfg.n_layer = integer("num_hidden_layers");
      cfg.n_head = integer("num_attention_heads");
      cfg.n_embd = integer("hidden_size");
      cfg.intermediate_size = integer("intermediate_size");
      cfg.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                          ? integer("num_key_value_heads")
                          : cfg.n_head;
      if (j.contains("head_dim") && !j["head_dim"].is_null()) cfg.head_dim = integer("head_dim");
      MINIDL_CHECK(cfg.head_dim > 0 || (cfg.n_head > 0 && cfg.n_embd % cfg.n_head == 0), source, ": hidden_size ",
                   cfg.n_embd, " is not divisible by num_attention_heads ", cfg.n_head, " and no head_dim is given");
      cfg.norm_eps = j.value("rms_norm_eps", 1e-6);
      cfg.rope_theta = j.value("rope_theta", 10000.0);
      cfg.tie_embeddings = j.value("tie_word_embeddings", false);
      const std::string act = j.value("hidden_act", "silu");
      MINIDL_CHECK(act == "silu", source, ": field \"hidden_act\": expected silu (SwiGLU), got ", act);
      for (const char* key : {"attention_bias", "mlp_bias"})
        MINIDL_CHECK(!j.value(key, false), source, ": field \"", key, "\": expected false (minidl's Llama has no ",
                     "biases), got true");
      if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
        const nlohmann::json& s = j["rope_scaling"];
        const std::string rope_type = s.value("rope_type", s.value("type", ""));
        ops::RopeScaling& r = cfg.rope_scaling;
        if (rope_type == "default") {
          r.type = ops::RopeType::kNone;
        } else if (rope_type == "linear") {
          r.type = ops::RopeType::kLinear;
          r.factor = s.at("factor").get<double>();
        } else if (rope_type == "llama3") {
          r.type = ops::RopeType::kLlama3;
          r.factor = s.at("factor").get<double>();
          r.low_freq_factor = s.at("low_freq_factor").get<double>();
          r.high_freq_factor = s.at("high_freq_factor").get<double>();
          r.original_max_position_embeddings = s.at("original_max_position_embeddings").get<int64_t>();
        } else {
          MINIDL_CHECK(false, source, ": field \"rope_scaling\": unknown rope_type '", rope_type,
                       "'; supported: default, linear, llama3");
        }
      }
    } else {
      MINIDL_CHECK(false, source, ": field \"model_type\": expected gpt2, llama or mixtral, got '", type, "'");
    }
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, source, ": a field has the wrong type (", e.what(), ")");
  }
  try {
    cfg.validate();
  } catch (const Error& e) { MINIDL_CHECK(false, source, ": ", e.what()); }
  return cfg;
}

StateDict read_model_tensors(const std::string& path, const GPTConfig& cfg) {
  namespace fs = std::filesystem;
  std::vector<std::string> files{path};
  if (fs::is_directory(path)) {
    const fs::path single = fs::path(path) / "model.safetensors",
                   index = fs::path(path) / "model.safetensors.index.json";
    files.clear();
    if (fs::exists(single)) {
      files.push_back(single.string());
    } else {
      MINIDL_CHECK(fs::exists(index), path, ": no model.safetensors or model.safetensors.index.json in the folder");
      std::set<std::string> shards;
      try {
        const nlohmann::json map = nlohmann::json::parse(read_text(index.string())).at("weight_map");  // kept alive
        for (const auto& [name, file] : map.items()) shards.insert(file.get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        MINIDL_CHECK(false, index.string(), ": expected {\"weight_map\": {tensor: file, ...}} (", e.what(), ")");
      }
      for (const std::string& s : shards) files.push_back((fs::path(path) / s).string());
    }
  }
  StateDict out;
  for (const std::string& file : files) {
    SafetensorsFile f = load_safetensors(file);
    for (auto& [name, t] : f.tensors) {
      const std::string mine = minidl_tensor_name(cfg, name);
      if (mine.empty()) continue;  // kept by HF, not a minidl parameter
      Tensor v = t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32);
      if (hf_transposed(cfg, mine)) v = v.transpose(0, 1).contiguous();
      MINIDL_CHECK(out.emplace(mine, v).second, path, ": tensor ", name, " appears twice");
    }
  }
  // An MoE's expert biases (bias balancing's buffers) are 0 where the file has none (a Mixtral's, an aux-balanced
  // model's).
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    if (cfg.moe_layer(i))
      out.emplace("transformer.h." + std::to_string(i) + ".moe.expert_bias", Tensor::zeros({cfg.moe_experts}));
  return out;
}

}  // namespace minidl::nn
