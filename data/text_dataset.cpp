#include "data/text_dataset.h"

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/token_shards.h"

namespace minidl::data {

std::string read_text_file(const std::string& path) {
  MINIDL_CHECK(std::filesystem::is_regular_file(path), "text dataset: '", path,
               "' does not exist or is not a regular file");
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.is_open(), "text dataset: cannot open '", path, "' for reading");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  MINIDL_CHECK(!in.bad(), "text dataset: error while reading '", path, "'");
  std::string text = std::move(bytes).str();
  MINIDL_CHECK(!text.empty(), "text dataset: '", path, "' is empty (expected some text)");
  return text;
}

TextDataset::TextDataset(const std::string& path) : TextDataset(path, read_text_file(path), nullptr) {}

TextDataset::TextDataset(const std::string& path, const Tokenizer& tokenizer)
    : TextDataset(path, read_text_file(path), &tokenizer) {}

// A given character vocabulary is checked against every byte of `text` first, so the error names the vocabularies
// rather than a position.
static Tokenizer choose_tokenizer(const std::string& path, const std::string& text, const Tokenizer* given) {
  if (given && !given->chars()) return *given;  // GPT-2's encodes any bytes
  CharTokenizer own = CharTokenizer::from_text(text);
  if (!given) return Tokenizer::chars(std::move(own));
  const CharTokenizer& vocab = *given->chars();
  for (uint8_t b : own.vocab()) {
    bool known = std::binary_search(vocab.vocab().begin(), vocab.vocab().end(), b);
    MINIDL_CHECK(known, path, ": the corpus has ", own.size(), " distinct bytes, byte ", int(b),
                 (b >= 32 && b < 127 ? std::string(" '") + char(b) + "'" : std::string()),
                 " among them, which the given vocabulary of ", vocab.size(), " bytes does not have");
  }
  return *given;
}

// The byte at which the first 90% of the text's characters (UTF-8 code points) end.
static size_t ninety_percent_of_characters(const std::string& text) {
  size_t characters = 0;
  for (unsigned char c : text) characters += (c & 0xC0) != 0x80;
  const size_t keep = characters * 9 / 10;
  size_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && seen++ == keep) return i;
  return text.size();
}

TextDataset::TextDataset(const std::string& path, const std::string& text, const Tokenizer* tokenizer)
    : path_(path), tokenizer_(choose_tokenizer(path, text, tokenizer)) {
  if (tokenizer_.chars()) {
    std::vector<int32_t> ids = tokenizer_.encode(text);
    auto split = ids.begin() + std::ptrdiff_t(ids.size() * 9 / 10);
    train_.assign(ids.begin(), split);
    val_.assign(split, ids.end());
  } else {
    const size_t cut = ninety_percent_of_characters(text);
    train_ = tokenizer_.encode(std::string_view(text).substr(0, cut));
    val_ = tokenizer_.encode(std::string_view(text).substr(cut));
  }
}

TextDataset::TextDataset(std::string path, Tokenizer tokenizer, std::vector<int32_t> train, std::vector<int32_t> val)
    : path_(std::move(path)), tokenizer_(std::move(tokenizer)), train_(std::move(train)), val_(std::move(val)) {}

TextDataset TextDataset::from_shards(const std::string& pattern, const Tokenizer& tokenizer) {
  std::vector<int32_t> val;
  std::vector<std::string> train;
  int64_t train_tokens = 0, val_shards = 0;
  for (const std::string& file : shard_files(pattern)) {
    if (!is_validation_shard(file)) {
      train_tokens += shard_token_count(file);  // the header checked; the tokens stay on disk
      train.push_back(file);
      continue;
    }
    const std::vector<int32_t> tokens = read_token_shard(file);
    for (size_t i = 0; i < tokens.size(); ++i)
      MINIDL_CHECK(tokens[i] < tokenizer.size(), "token shard ", file, ": token ", i, " is ", tokens[i],
                   ", not an id of the ", tokenizer.kind(), " tokenizer (", tokenizer.size(), " ids)");
    val.insert(val.end(), tokens.begin(), tokens.end());
    ++val_shards;
  }
  MINIDL_CHECK(!train.empty() && val_shards > 0, "--data ", pattern, ": expected training shards and validation ",
               "shards (a \"val\" in the file name), found ", train.size(), " and ", val_shards);
  TextDataset ds(pattern, tokenizer, {}, std::move(val));
  ds.train_shards_ = std::move(train);
  ds.train_shard_tokens_ = train_tokens;
  return ds;
}

}  // namespace minidl::data
