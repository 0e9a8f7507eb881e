#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fstream>
#include <limits>
#include <thread>

#include "core/error.h"

namespace minidl::data {

namespace {

constexpr std::string_view kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kEndOfTextText = "<|endoftext|>";
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Standard base64 (RFC 4648, with padding) to bytes; false on any other character or a bad length.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + size_t(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = value(c)) < 0) {
        return false;
      }
    }
    const uint32_t bits = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
    out.push_back(char(bits >> 16));
    if (pad < 2) out.push_back(char(bits >> 8 & 0xff));
    if (pad < 1) out.push_back(char(bits & 0xff));
  }
  return true;
}

}  // namespace

// GPT-2's pattern, compiled for UTF-8 with Unicode properties; sequences that are not UTF-8 match nothing
// (PCRE2_MATCH_INVALID_UTF) instead of being an error.
struct Gpt2Tokenizer::Pattern {
  pcre2_code* code = nullptr;
  Pattern() {
    int error = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern.data()), kPattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      MINIDL_CHECK(false, "Gpt2Tokenizer: PCRE2 cannot compile GPT-2's pattern at offset ", at, ": ",
                   reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where JIT is not available, pcre2_match interprets
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

Gpt2Tokenizer::Gpt2Tokenizer() = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;

Gpt2Tokenizer Gpt2Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "GPT-2 encoding ", path, ": cannot open the file");
  Gpt2Tokenizer t;
  std::string line, bytes;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string rank_text = space == std::string::npos ? "" : line.substr(space + 1);
    const int64_t want = int64_t(t.tokens_.size());
    MINIDL_CHECK(space != std::string::npos && base64_decode(std::string_view(line).substr(0, space), bytes) &&
                     rank_text == std::to_string(want),
                 "GPT-2 encoding ", path, ", line ", number, ": expected 'BASE64 RANK' with rank ", want, ", got '",
                 line.substr(0, 80), "'");
    MINIDL_CHECK(t.ranks_.emplace(bytes, int32_t(want)).second, "GPT-2 encoding ", path, ", line ", number,
                 ": the bytes of rank ", want, " already have a rank");
    t.tokens_.push_back(bytes);
  }
  MINIDL_CHECK(t.tokens_.size() == size_t(kEndOfText), "GPT-2 encoding ", path, ": expected ", kEndOfText,
               " ranks (GPT-2's), got ", t.tokens_.size());
  for (int b = 0; b < 256; ++b)
    MINIDL_CHECK(t.ranks_.count(std::string(1, char(b))), "GPT-2 encoding ", path, ": byte ", b,
                 " has no rank (every byte must be a token)");
  t.pattern_ = std::make_unique<Pattern>();
  return t;
}

int32_t Gpt2Tokenizer::rank_of(std::string_view bytes) const {
  const auto it = ranks_.find(bytes);
  return it == ranks_.end() ? kNoRank : it->second;
}

// tiktoken's byte-pair merge: parts are the starts of the current tokens of the piece; rank[i] is the rank of parts
// i and i + 1 merged. The lowest rank merges first (the leftmost of equal ranks), and its neighbours' ranks are
// recomputed; quadratic in the piece's length, which pre-tokenisation keeps short.
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (const int32_t whole = rank_of(piece); whole != kNoRank) {
    out.push_back(whole);
    return;
  }
  struct Part {
    size_t start;
    int32_t rank;  // of this part merged with the next
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  for (size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, rank_of(piece.substr(i, 2))});
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  auto merged_rank = [&](size_t i) {  // parts i and i + 1 as one token, with the part after them
    return i + 3 < parts.size() ? rank_of(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start)) : kNoRank;
  };
  for (;;) {
    size_t best = 0;
    int32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
    if (best_rank == kNoRank) break;
    if (best > 0) parts[best - 1].rank = merged_rank(best - 1);
    parts[best].rank = merged_rank(best);
    parts.erase(parts.begin() + std::ptrdiff_t(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int32_t id = rank_of(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start));
    MINIDL_ASSERT(id != kNoRank, "Gpt2Tokenizer: a merged part has no rank");
    out.push_back(id);
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  MINIDL_CHECK(match != nullptr, "Gpt2Tokenizer::encode: PCRE2 could not allocate its match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(pattern_->code, subject, text.size(), offset, 0, match, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      pcre2_match_data_free(match);
      MINIDL_CHECK(false, "Gpt2Tokenizer::encode: PCRE2 failed at byte ", offset, ": ",
                   reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* found = pcre2_get_ovector_pointer(match);
    const size_t begin = rc > 0 ? size_t(found[0]) : text.size(), end = rc > 0 ? size_t(found[1]) : text.size();
    if (begin > offset) encode_piece(text.substr(offset, begin - offset), ids);  // bytes that are not UTF-8
    if (rc <= 0) break;
    encode_piece(text.substr(begin, end - begin), ids);
    offset = end;
  }
  pcre2_match_data_free(match);
  return ids;
}

std::vector<int32_t> Gpt2Tokenizer::encode_parallel(std::string_view text, int threads) const {
  // Cuts near i * size / threads, moved forward to between the two newlines of "\n\n" followed by a byte that is not
  // whitespace. There a whole text splits the run of whitespace before the word into all of it but its last newline
  // (\s+(?!\S)) and that newline (\s+), and so do the two parts: the first ends with the run less its newline (all
  // taken by \s+(?!\S) at the end), the second starts with the newline and the word. (Cut after both newlines, the
  // first part would end with "\n\n" as one piece, GPT-2's token 271, where the whole text has two 198s.)
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  std::vector<size_t> cuts{0};
  for (int i = 1; i < threads; ++i) {
    size_t at = std::max(cuts.back(), text.size() / size_t(threads) * size_t(i));
    while (at + 1 < text.size() && !(at >= 1 && text[at - 1] == '\n' && text[at] == '\n' && !is_space(text[at + 1])))
      ++at;
    if (at + 1 < text.size() && at > cuts.back()) cuts.push_back(at);
  }
  cuts.push_back(text.size());
  std::vector<std::vector<int32_t>> parts(cuts.size() - 1);
  std::vector<std::thread> workers;
  for (size_t p = 0; p + 1 < cuts.size(); ++p)
    workers.emplace_back([&, p] { parts[p] = encode(text.substr(cuts[p], cuts[p + 1] - cuts[p])); });
  for (std::thread& w : workers) w.join();
  std::vector<int32_t> ids;
  for (const auto& part : parts) ids.insert(ids.end(), part.begin(), part.end());
  return ids;
}

std::string_view Gpt2Tokenizer::token_bytes(int32_t id) const {
  MINIDL_CHECK(id >= 0 && id < size(), "Gpt2Tokenizer: id ", id, " is outside [0, ", size(), ")");
  return id == kEndOfText ? kEndOfTextText : std::string_view(tokens_[size_t(id)]);
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

}  // namespace minidl::data
