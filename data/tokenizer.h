// CharTokenizer: a byte-level character tokenizer. The vocabulary is the sorted set of distinct bytes of a corpus;
// a byte's id is its rank in that set (tinyshakespeare: 65 ids, '\n' = 0, ' ' = 1, ...), as nanoGPT's char model.
//
//   data::CharTokenizer tok = data::CharTokenizer::from_text(corpus);
//   std::vector<int32_t> ids = tok.encode("To be");
//   std::string text = tok.decode(ids);
//   nlohmann::json j = tok.to_json();          // a checkpoint carries the vocabulary...
//   auto same = data::CharTokenizer::from_json(j);  // ...so sampling can decode without the corpus
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/bpe_tokenizer.h"

namespace minidl::data {

class CharTokenizer {
 public:
  // vocab: strictly increasing bytes (checked).
  explicit CharTokenizer(std::vector<uint8_t> vocab);
  // The vocabulary of `corpus` (non-empty).
  static CharTokenizer from_text(std::string_view corpus);

  int64_t size() const { return int64_t(vocab_.size()); }
  const std::vector<uint8_t>& vocab() const { return vocab_; }

  // Throws naming the first byte not in the vocabulary and its position.
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws naming the first id outside [0, size()).
  std::string decode(std::span<const int32_t> ids) const;

  // {"type": "char", "vocab": [10, 32, 33, ...]} — bytes as numbers, so any byte survives JSON.
  nlohmann::json to_json() const;
  static CharTokenizer from_json(const nlohmann::json& j);

 private:
  std::vector<uint8_t> vocab_;
  std::array<int32_t, 256> id_of_;  // -1 for bytes outside the vocabulary
};

// Tokenizer: the ids of a run, the same for its dataset, its checkpoints and its samples: the corpus's characters
// (CharTokenizer), GPT-2's byte-level BPE (read from its encoding file) or a model's own byte-level BPE (a Hugging Face
// tokenizer.json, data/bpe_tokenizer.h). Copies share the tables.
//
//   data::Tokenizer t = data::Tokenizer::gpt2("data/gpt2.tiktoken");
//   nlohmann::json j = t.to_json();                          // {"type": "gpt2"}: a checkpoint's "vocab"
//   data::Tokenizer same = data::Tokenizer::from_json(j, "data/gpt2.tiktoken");
//   data::Tokenizer smol = data::Tokenizer::hf_file("SmolLM2-135M/tokenizer.json");
//   smol.to_json();                                          // {"type": "hf", "tokenizer.json": "<the file's text>"}
class Tokenizer {
 public:
  // --tokenizer's value: "char", "gpt2" or a tokenizer.json's path (a name ending in .json); anything else is an error
  // naming the three.
  static void check_kind(const std::string& flag);
  // The kind --tokenizer's value names: "char", "gpt2" or "hf".
  static std::string kind_of(const std::string& flag);
  // The characters of `text`.
  static Tokenizer chars_of(std::string_view text);
  static Tokenizer chars(CharTokenizer tokenizer);
  // GPT-2's, from its encoding file.
  static Tokenizer gpt2(const std::string& encoding_file);
  // A tokenizer.json (a byte-level BPE; others are refused naming what differs).
  static Tokenizer hf_file(const std::string& path);
  // {"type": "char", "vocab": [...]}, {"type": "gpt2"} (the tables read from `gpt2_encoding_file`), or {"type": "hf"}
  // with the file's text under "tokenizer.json" (a checkpoint carries it whole) or its path under "file" (what
  // nn::load_gpt says of a model folder that ships one).
  static Tokenizer from_json(const nlohmann::json& j, const std::string& gpt2_encoding_file);
  nlohmann::json to_json() const;

  const char* kind() const { return chars_ ? "char" : hf_json_ ? "hf" : "gpt2"; }
  // The characters' vocabulary; null for a BPE.
  const CharTokenizer* chars() const { return chars_.get(); }
  // The tokenizer.json's text (written beside a saved model); null for the others.
  const std::string* hf_json() const { return hf_json_.get(); }
  int64_t size() const { return bpe_ ? bpe_->size() : chars_->size(); }
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;
  // The token a sample starts from: a newline where the characters have one (else id 0); a BPE's first special token
  // (GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>), else its first token of "\n".
  int32_t sample_start() const;

 private:
  std::shared_ptr<const CharTokenizer> chars_;
  std::shared_ptr<const BpeTokenizer> bpe_;
  std::shared_ptr<const std::string> hf_json_;
};

}  // namespace minidl::data
