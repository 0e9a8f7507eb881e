#include "nn/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "nn/atomic_file.h"

namespace minidl::nn {

std::string gpt_config_to_json(const GPTConfig& cfg) {
  nlohmann::ordered_json j = {
      {"vocab_size", cfg.vocab_size}, {"block_size", cfg.block_size}, {"n_layer", cfg.n_layer}, {"n_head", cfg.n_head},
      {"n_embd", cfg.n_embd},         {"dropout", cfg.dropout},       {"bias", cfg.bias},
  };
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
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, "GPT config: expected a JSON object with vocab_size, block_size, n_layer, n_head, n_embd, ",
                 "dropout and bias, got '", text, "' (", e.what(), ")");
  }
  cfg.validate();
  return cfg;
}

// GPT2LMHeadModel's config.json for this model (the keys transformers' GPT2Config reads).
static std::string hf_config_json(const GPTConfig& cfg) {
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

void save_gpt(const std::string& path, const GPT& model, const std::string& vocab_json, const Metadata& extras) {
  MINIDL_CHECK(nlohmann::json::accept(vocab_json), "save_gpt('", path,
               "'): the vocabulary must be a JSON document, got '", vocab_json.substr(0, 80), "'");
  Metadata metadata = {{"format", "pt"}, {"config", gpt_config_to_json(model.config())}, {"vocab", vocab_json}};
  for (const auto& [key, value] : extras)
    MINIDL_CHECK(metadata.emplace(key, value).second, "save_gpt('", path, "'): the metadata key '", key,
                 "' is reserved (format, config, vocab)");
  save_safetensors(path, model.named_parameters(), metadata);
  std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "config.json";
  write_text_file_atomically(config_path.string(), hf_config_json(model.config()));
}

GPTCheckpoint load_gpt(const std::string& path) {
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
  SafetensorsFile file = load_safetensors(path);
  try {
    model.load_state_dict(file.tensors, /*strict=*/true);
  } catch (const Error& e) { MINIDL_CHECK(false, "load_into('", path, "'): ", e.what()); }
}

}  // namespace minidl::nn
