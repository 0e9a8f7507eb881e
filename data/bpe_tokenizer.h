// BpeTokenizer: byte-level BPE, the tokenizer of GPT-2, Llama 3, SmolLM and most models since. Two sources:
// - GPT-2's encoding file (data/gpt2.tiktoken: one token's bytes in base64 and its rank per line, 50,256 ranks; MIT
//   license, data/gpt2.tiktoken.LICENSE), with <|endoftext|> as id 50256. Ids equal tiktoken's.
// - A Hugging Face `tokenizer.json` (the `tokenizers` library's file, shipped beside a model's weights) whose model is
//   byte-level BPE. Ids equal `tokenizers`' `encode(text, add_special_tokens=False)`.
//
//   data::BpeTokenizer gpt2 = data::BpeTokenizer::gpt2("data/gpt2.tiktoken");
//   std::vector<int32_t> ids = gpt2.encode("Hello world");   // {15496, 995}
//   std::string text = gpt2.decode(ids);                     // "Hello world"
//   data::BpeTokenizer smol = data::BpeTokenizer::from_hf_json_file("SmolLM2-135M/tokenizer.json");
//
// Encoding has two steps. Pre-tokenisation cuts the text into pieces with a pattern over Unicode categories (PCRE2,
// compiled once, JIT where the platform has it); GPT-2's is
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and a tokenizer.json may name another (Llama 3's Split). Then each piece's bytes are merged pairwise, always the
// adjacent pair of lowest rank, until no adjacent pair merges; the ids are those of what is left. The rank of a pair:
// - tiktoken's rule (GPT-2's file): the rank of the merged bytes as a token. A piece that is a token by itself (most
//   words) is one lookup.
// - tokenizers' rule (tokenizer.json): the pair's line in "merges" (strings "a b" or, since tokenizers 0.20, pairs
//   ["a", "b"]). A whole-piece lookup first only where the model says "ignore_merges" (Llama 3's does).
// A tokenizer.json's vocabulary spells bytes as GPT-2's printable characters (bytes_to_unicode): they are read back
// to bytes, so the tables here are bytes in both cases.
//
// Bytes that are not UTF-8 cannot be matched by the pattern: each run of them is a piece of its own, merged by the
// same rule (single bytes are always tokens), so decode(encode(x)) == x for any bytes. (tiktoken and tokenizers take
// only valid Unicode text.) Special tokens: GPT-2's file has none that text can spell ("<|endoftext|>" encodes as its
// characters; id 50256 decodes to it). A tokenizer.json's added tokens are cut out of the text first and are their
// own ids, as tokenizers does. A template's BOS/EOS (the post-processor) is not added: a training text is its tokens.
//
// Supported tokenizer.json: model "BPE" (no dropout, no byte fallback, no subword prefix or suffix), pre-tokenizer
// ByteLevel (its own regex, GPT-2's) or a Sequence of Split (a Regex, behavior "Isolated") and ByteLevel without its
// regex, no normalizer, decoder ByteLevel. Anything else (SentencePiece-style BPE as Llama 2's, with Metaspace and
// byte fallback; WordPiece; a normalizer) is refused naming the field, the value found and what is supported.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace minidl::data {

class BpeTokenizer {
 public:
  static constexpr int32_t kGpt2EndOfText = 50256;

  // GPT-2's, from its encoding file (throws naming the file and line of a malformed one: expected "BASE64 RANK" with
  // ranks 0, 1, 2, ... in order).
  static BpeTokenizer gpt2(const std::string& encoding_file);
  // From a tokenizer.json's text; `source` names it in errors.
  static BpeTokenizer from_hf_json(std::string_view json_text, const std::string& source);
  static BpeTokenizer from_hf_json_file(const std::string& path);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // Every id: GPT-2's 50,256 ranks and <|endoftext|>: 50,257; a tokenizer.json's vocabulary and added tokens.
  int64_t size() const { return int64_t(tokens_.size()); }

  // Thread-safe: every call has its own match state.
  std::vector<int32_t> encode(std::string_view text) const;
  // encode(text) on `threads` threads: the text is cut only between the two newlines of a blank line followed by a
  // character that is not whitespace, where the whole text's pieces end too under GPT-2's pattern, so the ids are
  // encode(text)'s exactly. Another pattern, or added tokens, encode on one thread.
  std::vector<int32_t> encode_parallel(std::string_view text, int threads) const;
  // Throws naming the first id outside [0, size()).
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token (GPT-2's 50256: "<|endoftext|>").
  std::string_view token_bytes(int32_t id) const;
  // The special token a sample starts from: the added token of lowest id (GPT-2's <|endoftext|>, SmolLM's
  // <|endoftext|>, Llama 3's <|begin_of_text|>), -1 where there is none.
  int32_t first_special() const { return first_special_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Pattern;  // a compiled pre-tokenisation pattern (PCRE2)

  BpeTokenizer();
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // no added tokens in `text`
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t id_of(std::string_view bytes) const;
  // The rank of merging the parts [a, b) and [b, e) of a piece (kNoRank where they do not merge).
  int32_t pair_rank(std::string_view piece, size_t a, size_t b, size_t e) const;

  std::vector<std::string> tokens_;                                      // by id: bytes (an added token: its text)
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;  // bytes -> id, the BPE vocabulary
  // tokenizers' rule: (left id, right id) -> the merge's line; empty for tiktoken's rule.
  std::unordered_map<uint64_t, int32_t> merges_;
  bool whole_piece_first_ = true;
  bool add_prefix_space_ = false;
  bool gpt2_pattern_ = true;
  std::vector<std::pair<std::string, int32_t>> specials_;  // added tokens cut out of text, longest first
  std::array<bool, 256> special_first_{};                  // the first bytes of the added tokens
  int32_t first_special_ = -1;
  std::unique_ptr<Pattern> pattern_;
};

}  // namespace minidl::data
