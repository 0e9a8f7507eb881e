#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace minidl::data {

namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
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

// A pre-tokenisation pattern, compiled for UTF-8 with Unicode properties; sequences that are not UTF-8 match nothing
// (PCRE2_MATCH_INVALID_UTF) instead of being an error.
struct BpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  explicit Pattern(std::string_view pattern, const std::string& source) {
    int error = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      MINIDL_CHECK(false, source, ": PCRE2 cannot compile the pre-tokenisation pattern '", pattern, "' at offset ", at,
                   ": ", reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where JIT is not available, pcre2_match interprets
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::gpt2(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "GPT-2 encoding ", path, ": cannot open the file");
  BpeTokenizer t;
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
    MINIDL_CHECK(t.ids_.emplace(bytes, int32_t(want)).second, "GPT-2 encoding ", path, ", line ", number,
                 ": the bytes of rank ", want, " already have a rank");
    t.tokens_.push_back(bytes);
  }
  MINIDL_CHECK(t.tokens_.size() == size_t(kGpt2EndOfText), "GPT-2 encoding ", path, ": expected ", kGpt2EndOfText,
               " ranks (GPT-2's), got ", t.tokens_.size());
  for (int b = 0; b < 256; ++b)
    MINIDL_CHECK(t.ids_.count(std::string(1, char(b))), "GPT-2 encoding ", path, ": byte ", b,
                 " has no rank (every byte must be a token)");
  t.tokens_.emplace_back(kEndOfTextText);  // not in ids_: text never spells it
  t.first_special_ = kGpt2EndOfText;
  t.pattern_ = std::make_unique<Pattern>(kGpt2Pattern, "GPT-2 encoding " + path);
  return t;
}

namespace {

// GPT-2's bytes_to_unicode, inverted: the character a tokenizer.json writes for each byte back to the byte. Bytes
// that print (33-126, 161-172, 174-255) are themselves; the other 68, in order, are U+0100, U+0101, ...
std::unordered_map<char32_t, uint8_t> unicode_to_byte() {
  std::unordered_map<char32_t, uint8_t> m;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    m[prints ? char32_t(b) : next++] = uint8_t(b);
  }
  return m;
}

// A vocabulary entry's characters (UTF-8) to the bytes they stand for; false where one is not a byte's character.
bool byte_level_decode(const std::string& text, const std::unordered_map<char32_t, uint8_t>& bytes_of,
                       std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = uint8_t(text[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + size_t(n) > text.size()) return false;
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < n; ++k) cp = cp << 6 | (uint8_t(text[i + size_t(k)]) & 0x3f);
    const auto it = bytes_of.find(cp);
    if (it == bytes_of.end()) return false;
    out.push_back(char(it->second));
    i += size_t(n);
  }
  return true;
}

uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

}  // namespace

BpeTokenizer BpeTokenizer::from_hf_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "tokenizer ", path, ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  return from_hf_json(text.str(), path);
}

BpeTokenizer BpeTokenizer::from_hf_json(std::string_view json_text, const std::string& source) {
  const std::string where = "tokenizer " + source;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) { MINIDL_CHECK(false, where, ": not JSON (", e.what(), ")"); }
  auto refuse = [&](const std::string& field, const nlohmann::json& value, const char* supported) {
    MINIDL_CHECK(false, where, ": ", field, " is ", value.dump().substr(0, 200), "; supported: ", supported,
                 " (byte-level BPE as GPT-2's, Llama 3's and SmolLM's tokenizer.json)");
  };
  MINIDL_CHECK(doc.is_object() && doc.contains("model") && doc["model"].is_object(), where,
               ": expected a tokenizers file (an object with a \"model\"), got ", doc.dump().substr(0, 120));
  const nlohmann::json& model = doc["model"];
  if (model.value("type", "") != "BPE") refuse("model.type", model.value("type", nlohmann::json()), "\"BPE\"");
  auto absent = [&](const char* key) { return !model.contains(key) || model[key].is_null(); };
  if (!absent("dropout") && model["dropout"] != 0) refuse("model.dropout", model["dropout"], "null");
  if (model.value("byte_fallback", false)) refuse("model.byte_fallback", true, "false (SentencePiece-style BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!absent(key) && model[key] != "") refuse(std::string("model.") + key, model[key], "null");
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) refuse("normalizer", doc["normalizer"], "null");
  if (doc.contains("decoder") && !doc["decoder"].is_null() && doc["decoder"].value("type", "") != "ByteLevel")
    refuse("decoder", doc["decoder"], "ByteLevel");

  BpeTokenizer t;
  t.whole_piece_first_ = model.value("ignore_merges", false);
  // The pre-tokenizer: ByteLevel with GPT-2's pattern, or a Split's pattern and then ByteLevel without one.
  std::string pattern;
  const nlohmann::json pre = doc.value("pre_tokenizer", nlohmann::json());
  auto byte_level = [&](const nlohmann::json& p, bool regex_allowed) {
    if (!p.is_object() || p.value("type", "") != "ByteLevel") return false;
    t.add_prefix_space_ = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      if (!regex_allowed) refuse("pre_tokenizer's ByteLevel after a Split", p, "\"use_regex\": false");
      pattern = kGpt2Pattern;
    }
    return true;
  };
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].size() == 2) {
    const nlohmann::json& split = pre["pretokenizers"][0];
    if (split.value("type", "") != "Split" || !split.contains("pattern") || !split["pattern"].contains("Regex") ||
        split.value("behavior", "") != "Isolated" || split.value("invert", false))
      refuse("pre_tokenizer.pretokenizers[0]", split, "a Split by a Regex, behavior \"Isolated\", not inverted");
    pattern = split["pattern"]["Regex"].get<std::string>();
    if (!byte_level(pre["pretokenizers"][1], false))
      refuse("pre_tokenizer.pretokenizers[1]", pre["pretokenizers"][1], "ByteLevel");
  } else if (!byte_level(pre, true)) {
    refuse("pre_tokenizer", pre, "ByteLevel, or a Sequence of a Split and ByteLevel");
  }
  t.gpt2_pattern_ = pattern == kGpt2Pattern;

  // The vocabulary: each entry's characters back to bytes; the ids 0, 1, ... with none missing.
  MINIDL_CHECK(model.contains("vocab") && model["vocab"].is_object(), where, ": expected model.vocab, an object");
  const auto bytes_of = unicode_to_byte();
  std::vector<std::pair<int64_t, std::string>> entries;
  std::string bytes;
  for (const auto& [token, id] : model["vocab"].items()) {
    MINIDL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, where, ": model.vocab[\"", token,
                 "\"]: expected an id >= 0, got ", id.dump());
    MINIDL_CHECK(byte_level_decode(token, bytes_of, bytes), where, ": model.vocab[\"", token,
                 "\"] is not spelt in ByteLevel's characters (is it a byte-level BPE?)");
    entries.emplace_back(id.get<int64_t>(), bytes);
  }
  std::vector<std::pair<int64_t, std::string>> added;
  for (const nlohmann::json& a : doc.value("added_tokens", nlohmann::json::array())) {
    MINIDL_CHECK(a.contains("id") && a["id"].is_number_integer() && a.contains("content") && a["content"].is_string(),
                 where, ": added_tokens: expected {\"id\": N, \"content\": \"...\"}, got ", a.dump());
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      if (a.value(key, false)) refuse(std::string("added token ") + a["content"].dump() + "'s " + key, true, "false");
    added.emplace_back(a["id"].get<int64_t>(), a["content"].get<std::string>());
  }
  int64_t n = 0;
  for (const auto& e : entries) n = std::max(n, e.first + 1);
  for (const auto& e : added) n = std::max(n, e.first + 1);
  std::vector<char> seen(size_t(n), 0);
  t.tokens_.assign(size_t(n), {});
  for (const auto& [id, b] : entries) {
    seen[size_t(id)] = 1;
    t.tokens_[size_t(id)] = b;
    MINIDL_CHECK(t.ids_.emplace(b, int32_t(id)).second, where, ": model.vocab has two ids for the same bytes (",
                 t.ids_[b], " and ", id, ")");
  }
  for (const auto& [id, content] : added) {
    MINIDL_CHECK(!seen[size_t(id)] || t.tokens_[size_t(id)] == content, where, ": added token ", id, " (\"", content,
                 "\") is another token of model.vocab");
    seen[size_t(id)] = 1;
    t.tokens_[size_t(id)] = content;
    t.specials_.emplace_back(content, int32_t(id));
    if (!content.empty()) t.special_first_[uint8_t(content[0])] = true;
    if (t.first_special_ < 0 || id < t.first_special_) t.first_special_ = int32_t(id);
  }
  const auto gap = std::find(seen.begin(), seen.end(), 0);
  MINIDL_CHECK(gap == seen.end(), where, ": id ", gap - seen.begin(), " is in neither model.vocab nor added_tokens",
               " (expected the ids 0 to ", n - 1, ")");
  for (int b = 0; b < 256; ++b)
    MINIDL_CHECK(t.ids_.count(std::string(1, char(b))), where, ": byte ", b,
                 " has no token (a byte-level BPE has all 256)");
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });

  // The merges, in order: "left right" (a space cannot be in a token: ByteLevel spells it as U+0120) or [left, right].
  MINIDL_CHECK(model.contains("merges") && model["merges"].is_array(), where, ": expected model.merges, an array");
  int32_t line = 0;
  for (const nlohmann::json& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space != std::string::npos) left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    }
    std::string lb, rb;
    MINIDL_CHECK(!left.empty() && !right.empty() && byte_level_decode(left, bytes_of, lb) &&
                     byte_level_decode(right, bytes_of, rb),
                 where, ": model.merges[", line,
                 "]: expected \"a b\" or [\"a\", \"b\"] in ByteLevel's characters, got ", m.dump());
    const int32_t l = t.id_of(lb), r = t.id_of(rb), merged = t.id_of(lb + rb);
    MINIDL_CHECK(l != kNoRank && r != kNoRank && merged != kNoRank, where, ": model.merges[", line, "] (", m.dump(),
                 "): a part or the merged token is not in model.vocab");
    t.merges_.emplace(pair_key(l, r), line);  // a repeated pair keeps its first line, as tokenizers does
    ++line;
  }
  t.pattern_ = std::make_unique<Pattern>(pattern, where);
  return t;
}

int32_t BpeTokenizer::id_of(std::string_view bytes) const {
  const auto it = ids_.find(bytes);
  return it == ids_.end() ? kNoRank : it->second;
}

int32_t BpeTokenizer::pair_rank(std::string_view piece, size_t a, size_t b, size_t e) const {
  if (merges_.empty()) return id_of(piece.substr(a, e - a));  // tiktoken: the merged bytes' rank
  const int32_t left = id_of(piece.substr(a, b - a)), right = id_of(piece.substr(b, e - b));
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? kNoRank : it->second;
}

// The byte-pair merge: parts are the starts of the current tokens of the piece; rank[i] is the rank of merging parts
// i and i + 1. The lowest rank merges first (the leftmost of equal ranks), and its neighbours' ranks are recomputed;
// quadratic in the piece's length, which pre-tokenisation keeps short.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (whole_piece_first_)
    if (const int32_t whole = id_of(piece); whole != kNoRank) {
      out.push_back(whole);
      return;
    }
  struct Part {
    size_t start;
    int32_t rank;  // of this part merged with the next
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  for (size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, pair_rank(piece, i, i + 1, i + 2)});
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  for (;;) {
    size_t best = 0;
    int32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
    if (best_rank == kNoRank) break;
    // parts best and best + 1 become one, [parts[best].start, parts[best + 2].start)
    if (best > 0)
      parts[best - 1].rank = pair_rank(piece, parts[best - 1].start, parts[best].start, parts[best + 2].start);
    parts[best].rank = best + 3 < parts.size()
                           ? pair_rank(piece, parts[best].start, parts[best + 2].start, parts[best + 3].start)
                           : kNoRank;
    parts.erase(parts.begin() + std::ptrdiff_t(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int32_t id = id_of(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start));
    MINIDL_ASSERT(id != kNoRank, "BpeTokenizer: a merged part has no id");
    out.push_back(id);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  if (specials_.empty()) {
    encode_text(text, ids);
    return ids;
  }
  // Added tokens first, as tokenizers cuts them: the leftmost occurrence, the longest of those starting there.
  size_t from = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    if (!special_first_[uint8_t(text[at])]) continue;
    for (const auto& [content, id] : specials_) {
      if (!content.empty() && text.substr(at).starts_with(content)) {
        if (at > from) encode_text(text.substr(from, at - from), ids);
        ids.push_back(id);
        from = at + content.size();
        at = from - 1;
        break;
      }
    }
  }
  if (from < text.size()) encode_text(text.substr(from), ids);
  return ids;
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::string prefixed;
  if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  MINIDL_CHECK(match != nullptr, "BpeTokenizer::encode: PCRE2 could not allocate its match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t from = 0, offset = 0;  // the text before `from` is encoded; the next match is searched from `offset`
  while (offset < text.size()) {
    const int rc = pcre2_match(pattern_->code, subject, text.size(), offset, 0, match, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      pcre2_match_data_free(match);
      MINIDL_CHECK(false, "BpeTokenizer::encode: PCRE2 failed at byte ", offset, ": ",
                   reinterpret_cast<const char*>(message));
    }
    if (rc <= 0) break;
    const PCRE2_SIZE* found = pcre2_get_ovector_pointer(match);
    const size_t begin = size_t(found[0]), end = size_t(found[1]);
    if (end == begin) {  // an empty match (a pattern such as \s*) is no piece: search on from the next character
      offset = end + 1;
      while (offset < text.size() && (uint8_t(text[offset]) & 0xc0) == 0x80) ++offset;
      continue;
    }
    if (begin > from) encode_piece(text.substr(from, begin - from), ids);  // bytes that are not UTF-8, or a gap
    encode_piece(text.substr(begin, end - begin), ids);
    from = offset = end;
  }
  if (from < text.size()) encode_piece(text.substr(from), ids);
  pcre2_match_data_free(match);
}

std::vector<int32_t> BpeTokenizer::encode_parallel(std::string_view text, int threads) const {
  if (!gpt2_pattern_ || !specials_.empty() || add_prefix_space_) return encode(text);
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

std::string_view BpeTokenizer::token_bytes(int32_t id) const {
  MINIDL_CHECK(id >= 0 && id < size(), "BpeTokenizer: id ", id, " is outside [0, ", size(), ")");
  return tokens_[size_t(id)];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

}  // namespace minidl::data
