#include "data/text_dataset.h"

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

TextDataset::TextDataset(const std::string& path) : TextDataset(path, read_text_file(path)) {}

// The vocabulary comes from the whole file (both splits), so every validation byte has an id.
TextDataset::TextDataset(const std::string& path, const std::string& text)
    : path_(path), tokenizer_(CharTokenizer::from_text(text)) {
  std::vector<int32_t> ids = tokenizer_.encode(text);
  auto split = ids.begin() + std::ptrdiff_t(ids.size() * 9 / 10);
  train_.assign(ids.begin(), split);
  val_.assign(split, ids.end());
}

}  // namespace minidl::data
