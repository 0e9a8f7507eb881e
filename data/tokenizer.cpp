#include "data/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace minidl::data {

// For error messages: "0x41 'A'", or "0x0a" for a byte that does not print.
static std::string describe_byte(uint8_t b) {
  char buf[16];
  if (std::isprint(b))
    std::snprintf(buf, sizeof buf, "0x%02x '%c'", b, b);
  else
    std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

CharTokenizer::CharTokenizer(std::vector<uint8_t> vocab) : vocab_(std::move(vocab)) {
  MINIDL_CHECK(!vocab_.empty(), "CharTokenizer: expected a non-empty vocabulary");
  id_of_.fill(-1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    MINIDL_CHECK(i == 0 || vocab_[i - 1] < vocab_[i], "CharTokenizer: expected strictly increasing bytes, got ",
                 describe_byte(vocab_[i]), " after ", describe_byte(vocab_[i - 1]), " at index ", i);
    id_of_[vocab_[i]] = int32_t(i);
  }
}

CharTokenizer CharTokenizer::from_text(std::string_view corpus) {
  MINIDL_CHECK(!corpus.empty(), "CharTokenizer::from_text: expected a non-empty corpus");
  std::array<bool, 256> present{};
  for (char c : corpus) present[uint8_t(c)] = true;
  std::vector<uint8_t> vocab;
  for (int b = 0; b < 256; ++b)
    if (present[size_t(b)]) vocab.push_back(uint8_t(b));
  return CharTokenizer(std::move(vocab));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t id = id_of_[uint8_t(text[i])];
    MINIDL_CHECK(id >= 0, "CharTokenizer::encode: byte ", describe_byte(uint8_t(text[i])), " at position ", i,
                 " is not in the vocabulary (", size(), " bytes)");
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    MINIDL_CHECK(ids[i] >= 0 && ids[i] < size(), "CharTokenizer::decode: id ", ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", size(), ")");
    text[i] = char(vocab_[size_t(ids[i])]);
  }
  return text;
}

nlohmann::json CharTokenizer::to_json() const { return {{"type", "char"}, {"vocab", vocab_}}; }

CharTokenizer CharTokenizer::from_json(const nlohmann::json& j) {
  MINIDL_CHECK(j.is_object() && j.value("type", "") == "char" && j.contains("vocab") && j["vocab"].is_array(),
               "CharTokenizer::from_json: expected {\"type\": \"char\", \"vocab\": [...]}, got ", j.dump());
  std::vector<uint8_t> vocab;
  for (const nlohmann::json& b : j["vocab"]) {
    MINIDL_CHECK(b.is_number_integer() && b.get<int64_t>() >= 0 && b.get<int64_t>() <= 255,
                 "CharTokenizer::from_json: expected bytes 0..255 in \"vocab\", got ", b.dump());
    vocab.push_back(uint8_t(b.get<int64_t>()));
  }
  return CharTokenizer(std::move(vocab));
}

std::string Tokenizer::kind_of(const std::string& flag) {
  return flag.size() > 5 && flag.ends_with(".json") ? "hf" : flag;
}

void Tokenizer::check_kind(const std::string& flag) {
  MINIDL_CHECK(flag == "char" || flag == "gpt2" || kind_of(flag) == "hf",
               "--tokenizer: expected char, gpt2 or a tokenizer.json file, got '", flag, "'");
}

Tokenizer Tokenizer::chars_of(std::string_view text) { return chars(CharTokenizer::from_text(text)); }

Tokenizer Tokenizer::chars(CharTokenizer tokenizer) {
  Tokenizer t;
  t.chars_ = std::make_shared<const CharTokenizer>(std::move(tokenizer));
  return t;
}

Tokenizer Tokenizer::gpt2(const std::string& encoding_file) {
  Tokenizer t;
  t.bpe_ = std::make_shared<const BpeTokenizer>(BpeTokenizer::gpt2(encoding_file));
  return t;
}

Tokenizer Tokenizer::hf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "tokenizer ", path, ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  Tokenizer t;
  t.bpe_ = std::make_shared<const BpeTokenizer>(BpeTokenizer::from_hf_json(text.str(), path));
  t.hf_json_ = std::make_shared<const std::string>(text.str());
  return t;
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const std::string& gpt2_encoding_file) {
  const std::string type = j.is_object() ? j.value("type", "") : "";
  if (type == "gpt2") return gpt2(gpt2_encoding_file);
  if (type == "hf") {
    if (j.contains("file") && j["file"].is_string()) return hf_file(j["file"].get<std::string>());
    MINIDL_CHECK(j.contains("tokenizer.json") && j["tokenizer.json"].is_string(),
                 "Tokenizer::from_json: expected {\"type\": \"hf\"} with \"tokenizer.json\" (the file's text) or "
                 "\"file\" (its path), got the keys ",
                 j.dump().substr(0, 120));
    Tokenizer t;
    const std::string& text = j["tokenizer.json"].get_ref<const std::string&>();
    t.bpe_ = std::make_shared<const BpeTokenizer>(BpeTokenizer::from_hf_json(text, "saved in the checkpoint"));
    t.hf_json_ = std::make_shared<const std::string>(text);
    return t;
  }
  return chars(CharTokenizer::from_json(j));
}

nlohmann::json Tokenizer::to_json() const {
  if (chars_) return chars_->to_json();
  if (hf_json_) return {{"type", "hf"}, {"tokenizer.json", *hf_json_}};
  return {{"type", "gpt2"}};
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  return bpe_ ? bpe_->encode(text) : chars_->encode(text);
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  return bpe_ ? bpe_->decode(ids) : chars_->decode(ids);
}

int32_t Tokenizer::sample_start() const {
  if (bpe_) return bpe_->first_special() >= 0 ? bpe_->first_special() : bpe_->encode("\n").at(0);
  const auto& v = chars_->vocab();
  return std::binary_search(v.begin(), v.end(), uint8_t('\n')) ? chars_->encode("\n")[0] : 0;
}

}  // namespace minidl::data
