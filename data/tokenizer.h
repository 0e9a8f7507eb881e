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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

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

}  // namespace minidl::data
