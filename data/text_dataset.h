// TextDataset: a text file tokenized with its own character vocabulary and split into train and validation.
//
// The split is nanoGPT's: with n tokens, the first floor(0.9 * n) (computed exactly as n * 9 / 10 in integers) are
// the training split and the rest the validation split. tinyshakespeare: 1,115,394 tokens -> 1,003,854 train,
// 111,540 val.
//
//   data::TextDataset ds(data_dir + "/tinyshakespeare.txt");
//   data::BatchSampler train(ds.train(), seq, global_batch, seed);
//   ds.tokenizer().decode(ids);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace minidl::data {

class TextDataset {
 public:
  // Reads the whole file; a missing, unreadable or empty file is an error naming the path.
  explicit TextDataset(const std::string& path);
  // Tokenizes with a given vocabulary (a checkpoint's); a byte outside it is an error naming the byte and both
  // vocabulary sizes.
  TextDataset(const std::string& path, const CharTokenizer& tokenizer);

  const std::string& path() const { return path_; }
  const CharTokenizer& tokenizer() const { return tokenizer_; }
  const std::vector<int32_t>& train() const { return train_; }
  const std::vector<int32_t>& val() const { return val_; }

 private:
  // tokenizer == nullptr: the vocabulary of the whole text (both splits).
  TextDataset(const std::string& path, const std::string& text, const CharTokenizer* tokenizer);

  std::string path_;
  CharTokenizer tokenizer_;
  std::vector<int32_t> train_, val_;
};

// The bytes of a file; errors name the path and the problem (missing, unreadable, empty).
std::string read_text_file(const std::string& path);

}  // namespace minidl::data
