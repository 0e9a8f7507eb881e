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

#include "data/gpt2_tokenizer.h"

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
// (CharTokenizer) or GPT-2's byte-level BPE (Gpt2Tokenizer, read from its encoding file). Copies share the tables.
//
//   data::Tokenizer t = data::Tokenizer::gpt2("data/gpt2.tiktoken");
//   nlohmann::json j = t.to_json();                          // {"type": "gpt2"}: a checkpoint's "vocab"
//   data::Tokenizer same = data::Tokenizer::from_json(j, "data/gpt2.tiktoken");
class Tokenizer {
 public:
  // "char" or "gpt2"; anything else is an error naming both.
  static void check_kind(const std::string& kind);
  // The characters of `text`.
  static Tokenizer chars_of(std::string_view text);
  static Tokenizer chars(CharTokenizer tokenizer);
  // GPT-2's, from its encoding file.
  static Tokenizer gpt2(const std::string& encoding_file);
  // {"type": "char", "vocab": [...]} or {"type": "gpt2"}; GPT-2's tables are read from `gpt2_encoding_file`.
  static Tokenizer from_json(const nlohmann::json& j, const std::string& gpt2_encoding_file);
  nlohmann::json to_json() const;

  const char* kind() const { return gpt2_ ? "gpt2" : "char"; }
  // The characters' vocabulary; null for GPT-2's.
  const CharTokenizer* chars() const { return chars_.get(); }
  int64_t size() const { return gpt2_ ? gpt2_->size() : chars_->size(); }
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;
  // The token a sample starts from: a newline where the characters have one (else id 0), <|endoftext|> for GPT-2.
  int32_t sample_start() const;

 private:
  std::shared_ptr<const CharTokenizer> chars_;
  std::shared_ptr<const Gpt2Tokenizer> gpt2_;
};

}  // namespace minidl::data
