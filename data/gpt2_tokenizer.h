// Gpt2Tokenizer: GPT-2's byte-level BPE, read from its encoding file (data/gpt2.tiktoken: one token's bytes in
// base64 and its rank per line, 50,256 ranks; MIT license, data/gpt2.tiktoken.LICENSE). Ids equal tiktoken's.
//
//   data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::from_file("data/gpt2.tiktoken");
//   std::vector<int32_t> ids = tok.encode("Hello world");   // {15496, 995}
//   std::string text = tok.decode(ids);                     // "Hello world"
//
// Encoding is GPT-2's two steps. Pre-tokenisation cuts the text into pieces with GPT-2's pattern,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// over Unicode categories (PCRE2, compiled once, JIT where the platform has it). Then each piece's bytes are merged
// pairwise, always the adjacent pair whose merged bytes have the lowest rank, until no adjacent pair is a token;
// the ids are the ranks of what is left. A piece that is a token by itself (most words) is one lookup.
//
// Bytes that are not UTF-8 cannot be matched by the pattern: each run of them is a piece of its own, merged by the
// same rule (single bytes are always tokens), so decode(encode(x)) == x for any bytes. (tiktoken's encode takes
// only valid Unicode text.) Special tokens are not recognised in text: "<|endoftext|>" encodes as its characters;
// the id kEndOfText decodes to it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace minidl::data {

class Gpt2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;

  // Reads an encoding file (throws naming the file and line of a malformed one: expected "BASE64 RANK" with ranks
  // 0, 1, 2, ... in order).
  static Gpt2Tokenizer from_file(const std::string& path);
  ~Gpt2Tokenizer();
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;

  // The ranks and <|endoftext|>: 50,257 for GPT-2.
  int64_t size() const { return int64_t(tokens_.size()) + 1; }

  // Thread-safe: every call has its own match state.
  std::vector<int32_t> encode(std::string_view text) const;
  // encode(text) on `threads` threads: the text is cut only between the two newlines of a blank line followed by a
  // character that is not whitespace, where the whole text's pieces end too, so the ids are encode(text)'s exactly.
  std::vector<int32_t> encode_parallel(std::string_view text, int threads) const;
  // Throws naming the first id outside [0, size()).
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token (kEndOfText: "<|endoftext|>").
  std::string_view token_bytes(int32_t id) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Pattern;  // the compiled pre-tokenisation pattern (PCRE2)

  Gpt2Tokenizer();
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t rank_of(std::string_view bytes) const;

  std::vector<std::string> tokens_;                                        // by rank
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ranks_;  // bytes -> rank
  std::unique_ptr<Pattern> pattern_;
};

}  // namespace minidl::data
