#include "nn/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "nn/atomic_file.h"
#include "nn/hf_format.h"

namespace minidl::nn {

std::string gpt_config_to_json(const GPTConfig& cfg) {
  nlohmann::ordered_json j = {
      {"vocab_size", cfg.vocab_size}, {"block_size", cfg.block_size}, {"n_layer", cfg.n_layer}, {"n_head", cfg.n_head},
      {"n_embd", cfg.n_embd},         {"dropout", cfg.dropout},       {"bias", cfg.bias},
  };
  if (cfg.llama()) {  // GPT-2's files stay as they were
    const ops::RopeScaling& r = cfg.rope_scaling;
    j["arch"] = "llama";
    j["n_kv_head"] = cfg.kv_heads();
    j["head_dim"] = cfg.head_size();
    j["intermediate_size"] = cfg.mlp_width();
    j["norm_eps"] = cfg.norm_eps;
    j["rope_theta"] = cfg.rope_theta;
    j["rope_scaling"] = {{"type", r.type == ops::RopeType::kNone     ? "none"
                                  : r.type == ops::RopeType::kLinear ? "linear"
                                                                     : "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
    j["tie_embeddings"] = cfg.tie_embeddings;
    if (cfg.moe()) {
      j["moe"] = {{"experts", cfg.moe_experts},
                  {"top_k", cfg.moe_top_k},
                  {"every", cfg.moe_every},
                  {"shared", cfg.moe_shared},
                  {"router", cfg.moe_router == GPTConfig::Router::kSigmoid ? "sigmoid" : "softmax"},
                  {"balance", cfg.moe_balance == GPTConfig::Balance::kAux    ? "aux"
                              : cfg.moe_balance == GPTConfig::Balance::kBias ? "bias"
                                                                             : "none"},
                  {"aux_coef", cfg.moe_aux_coef},
                  {"bias_rate", cfg.moe_bias_rate},
                  {"capacity", cfg.moe_capacity}};
    }
  }
  return j.dump();
}

GPTConfig gpt_config_from_json(const std::string& text) {
  GPTConfig cfg;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    cfg.vocab_size = j.at("vocab_size").get<int64_t>();
    cfg.block_size = j.at("block_size").get<int64_t>();
    cfg.n_layer = j.at("n_layer").get<int64_t>();
    cfg.n_head = j.at("n_head").get<int64_t>();
    cfg.n_embd = j.at("n_embd").get<int64_t>();
    cfg.dropout = j.at("dropout").get<double>();
    cfg.bias = j.at("bias").get<bool>();
    if (j.value("arch", "gpt2") == "llama") {
      cfg.arch = GPTConfig::Arch::kLlama;
      cfg.n_kv_head = j.at("n_kv_head").get<int64_t>();
      cfg.head_dim = j.at("head_dim").get<int64_t>();
      cfg.intermediate_size = j.at("intermediate_size").get<int64_t>();
      cfg.norm_eps = j.at("norm_eps").get<double>();
      cfg.rope_theta = j.at("rope_theta").get<double>();
      cfg.tie_embeddings = j.at("tie_embeddings").get<bool>();
      const nlohmann::json& r = j.at("rope_scaling");
      const std::string type = r.at("type").get<std::string>();
      MINIDL_CHECK(type == "none" || type == "linear" || type == "llama3", "GPT config: unknown rope_scaling type '",
                   type, "'; supported: none, linear, llama3");
      cfg.rope_scaling = {type == "none"     ? ops::RopeType::kNone
                          : type == "linear" ? ops::RopeType::kLinear
                                             : ops::RopeType::kLlama3,
                          r.at("factor").get<double>(), r.at("low_freq_factor").get<double>(),
                          r.at("high_freq_factor").get<double>(),
                          r.at("original_max_position_embeddings").get<int64_t>()};
      if (j.contains("moe")) {
        const nlohmann::json& m = j.at("moe");
        cfg.moe_experts = m.at("experts").get<int64_t>();
        cfg.moe_top_k = m.at("top_k").get<int64_t>();
        cfg.moe_every = m.at("every").get<int64_t>();
        cfg.moe_shared = m.at("shared").get<int64_t>();
        cfg.moe_router =
            m.at("router").get<std::string>() == "sigmoid" ? GPTConfig::Router::kSigmoid : GPTConfig::Router::kSoftmax;
        const std::string balance = m.at("balance").get<std::string>();
        cfg.moe_balance = balance == "bias"   ? GPTConfig::Balance::kBias
                          : balance == "none" ? GPTConfig::Balance::kNone
                                              : GPTConfig::Balance::kAux;
        cfg.moe_aux_coef = m.at("aux_coef").get<double>();
        cfg.moe_bias_rate = m.at("bias_rate").get<double>();
        cfg.moe_capacity = m.at("capacity").get<double>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, "GPT config: expected a JSON object with vocab_size, block_size, n_layer, n_head, n_embd, ",
                 "dropout and bias, got '", text, "' (", e.what(), ")");
  }
  cfg.validate();
  return cfg;
}

void save_gpt(const std::string& path, const GPT& model, const std::string& vocab_json, const Metadata& extras) {
  MINIDL_CHECK(nlohmann::json::accept(vocab_json), "save_gpt('", path,
               "'): the vocabulary must be a JSON document, got '", vocab_json.substr(0, 80), "'");
  Metadata metadata = {{"format", "pt"}, {"config", gpt_config_to_json(model.config())}, {"vocab", vocab_json}};
  for (const auto& [key, value] : extras)
    MINIDL_CHECK(metadata.emplace(key, value).second, "save_gpt('", path, "'): the metadata key '", key,
                 "' is reserved (format, config, vocab)");
  // Under HF's names and layouts (nn/hf_format.h): GPT-2's are minidl's; a Llama's Linear weights go (out, in).
  NamedTensors tensors;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor t = p.detach();
    tensors.emplace_back(hf_tensor_name(model.config(), name),
                         hf_transposed(model.config(), name) ? t.transpose(0, 1).contiguous() : t);
  }
  // An MoE's expert bias, where bias balancing moved it (it changes which experts a token goes to).
  if (model.config().moe() && model.config().moe_balance == GPTConfig::Balance::kBias)
    for (const auto& [name, b] : model.named_buffers())
      if (name.find(".moe.expert_bias") != std::string::npos)
        tensors.emplace_back(hf_tensor_name(model.config(), name), b.detach());
  save_safetensors(path, tensors, metadata);
  // transformers' config.json beside it, where transformers has the model (hf_expressible: a mixture of experts
  // that is not a Mixtral has none; the file's own metadata holds minidl's config).
  if (!hf_expressible(model.config())) return;
  std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "config.json";
  write_text_file_atomically(config_path.string(), hf_config_json(model.config()));
}

GPTCheckpoint load_gpt(const std::string& path) {
  if (std::filesystem::is_directory(path)) {  // a folder as save_pretrained writes it: its config.json
    const std::string file = (std::filesystem::path(path) / "model.safetensors").string();
    if (std::filesystem::exists(file) && read_safetensors_header(file).metadata.count("config"))
      return load_gpt(file);  // minidl's --save: its own config and tokenizer
    const std::string config = (std::filesystem::path(path) / "config.json").string();
    MINIDL_CHECK(std::filesystem::exists(config), "load_gpt('", path, "'): a model folder needs a config.json");
    std::ifstream in(config);
    std::stringstream text;
    text << in.rdbuf();
    // The folder's tokenizer.json where it ships one (data::Tokenizer reads it), else GPT-2's byte-level BPE.
    const std::filesystem::path tokenizer = std::filesystem::path(path) / "tokenizer.json";
    nlohmann::json vocab = {{"type", "gpt2"}};
    if (std::filesystem::exists(tokenizer)) vocab = {{"type", "hf"}, {"file", tokenizer.string()}};
    return {config_from_hf_json(text.str(), config), {{"format", "pt"}, {"vocab", vocab.dump()}}};
  }
  SafetensorsHeader header = read_safetensors_header(path);
  auto it = header.metadata.find("config");
  MINIDL_CHECK(it != header.metadata.end(), "load_gpt('", path,
               "'): no \"config\" in the file's __metadata__; was it written by save_gpt?");
  try {
    return {gpt_config_from_json(it->second), std::move(header.metadata)};
  } catch (const Error& e) {
    MINIDL_CHECK(false, "load_gpt('", path, "'): __metadata__ field \"config\": ", e.what());
    throw;
  }
}

void load_into(GPT& model, const std::string& path) {
  try {
    model.load_state_dict(read_model_tensors(path, model.config()), /*strict=*/true);
  } catch (const Error& e) {
    // The names are minidl's; a Llama's file has LlamaForCausalLM's (nn/hf_format.h's table).
    MINIDL_CHECK(false, "load_into('", path, "'): ", e.what(),
                 model.config().llama() ? " (minidl's names; in the file they are LlamaForCausalLM's, as "
                                          "nn/hf_format.h maps them: transformer.h.<i>.ln_2.weight is "
                                          "model.layers.<i>.post_attention_layernorm.weight, ...)"
                                        : "");
  }
}

}  // namespace minidl::nn
