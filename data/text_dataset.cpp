#include "data/text_dataset.h"

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

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

TextDataset::TextDataset(const std::string& path, const CharTokenizer& tokenizer)
    : TextDataset(path, read_text_file(path), &tokenizer) {}

// Checks every byte of `text` against `vocab` first, so the error names the vocabularies rather than a position.
static CharTokenizer choose_tokenizer(const std::string& path, const std::string& text, const CharTokenizer* given) {
  CharTokenizer own = CharTokenizer::from_text(text);
  if (!given) return own;
  for (uint8_t b : own.vocab()) {
    bool known = std::binary_search(given->vocab().begin(), given->vocab().end(), b);
    MINIDL_CHECK(known, path, ": the corpus has ", own.size(), " distinct bytes, byte ", int(b),
                 (b >= 32 && b < 127 ? std::string(" '") + char(b) + "'" : std::string()),
                 " among them, which the given vocabulary of ", given->size(), " bytes does not have");
  }
  return *given;
}

TextDataset::TextDataset(const std::string& path, const std::string& text, const CharTokenizer* tokenizer)
    : path_(path), tokenizer_(choose_tokenizer(path, text, tokenizer)) {
  std::vector<int32_t> ids = tokenizer_.encode(text);
  auto split = ids.begin() + std::ptrdiff_t(ids.size() * 9 / 10);
  train_.assign(ids.begin(), split);
  val_.assign(split, ids.end());
}

}  // namespace minidl::data
