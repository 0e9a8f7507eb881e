// TextDataset: a text file tokenized with its own character vocabulary, or with a given tokenizer (a checkpoint's,
// or GPT-2's), and split into train and validation.
//
// The split is nanoGPT's. Characters: with n tokens, the first floor(0.9 * n) (computed exactly as n * 9 / 10 in
// integers) are the training split and the rest the validation split (tinyshakespeare: 1,115,394 tokens ->
// 1,003,854 train, 111,540 val). GPT-2's BPE: the text is cut at 90% of its characters (UTF-8 code points), and each
// part is encoded alone, as nanoGPT's prepare.py does (tinyshakespeare: 301,966 train, 36,059 val).
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
  // Tokenizes with a given tokenizer (a checkpoint's, or GPT-2's); with characters, a byte outside the vocabulary
  // is an error naming the byte and both vocabulary sizes.
  TextDataset(const std::string& path, const Tokenizer& tokenizer);
  // Token shards (data/token_shards.h) matching `pattern`: the shards whose names hold "val" are the validation
  // split, read whole (every token one of `tokenizer`'s ids), the others (in name order) the training split, which
  // stays on disk: train() is empty, train_shards() names the files (data::ShardSampler streams them), as llm.c's
  // scripts write them; both kinds must be there.
  static TextDataset from_shards(const std::string& pattern, const Tokenizer& tokenizer);

  const std::string& path() const { return path_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const std::vector<int32_t>& train() const { return train_; }
  // The training shards of a dataset made from_shards (empty otherwise), and the training split's token count.
  const std::vector<std::string>& train_shards() const { return train_shards_; }
  int64_t train_tokens() const { return train_shards_.empty() ? int64_t(train_.size()) : train_shard_tokens_; }
  const std::vector<int32_t>& val() const { return val_; }

 private:
  // tokenizer == nullptr: the vocabulary of the whole text (both splits).
  TextDataset(const std::string& path, const std::string& text, const Tokenizer* tokenizer);
  TextDataset(std::string path, Tokenizer tokenizer, std::vector<int32_t> train, std::vector<int32_t> val);

  std::string path_;
  Tokenizer tokenizer_;
  std::vector<int32_t> train_, val_;
  std::vector<std::string> train_shards_;
  int64_t train_shard_tokens_ = 0;
};

// The bytes of a file; errors name the path and the problem (missing, unreadable, empty).
std::string read_text_file(const std::string& path);

}  // namespace minidl::data
