// A model's own byte-level BPE from its tokenizer.json (data/bpe_tokenizer.h), against Hugging Face's `tokenizers`,
// the library that writes and reads the file: tests/data/hf_tokenizer_oracle.py trains three layouts on the shipped
// corpus (GPT-2's ByteLevel as SmolLM's, the same with add_prefix_space, Llama 3's Split + ByteLevel) and encodes a
// stress text (added tokens inside words and side by side, CJK, emoji, whitespace runs, digits) and the whole
// corpus; minidl's ids must be its ids, and the merges written as pairs (tokenizers >= 0.20) the same as strings.
// Without the oracle those tests skip with a message; the rest run everywhere: ignore_merges, every byte round trip,
// and the files minidl cannot read are refused naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "corpus.h"
#include "support/run_program.h"

namespace fs = std::filesystem;
using minidl::data::BpeTokenizer;

namespace {

using minidl::testing::data_dir;
using minidl::testing::read_bytes;

std::string python() {
  const char* venv = std::getenv("MINIDL_ORACLES_VENV");
  return std::string(venv ? venv : "/opt/minidl-oracles") + "/bin/python";
}

const char* kStress =
    "Hello, world! It's 2026; they'll say we'd've... naïve café Ünïcödé — «quotes» “double”\n"
    "日本語のテキスト 中文文本 한국어 текст ελληνικά العربية\n"
    "emoji: 👩‍💻🚀🎉 flags 🇫🇷 and <|endoftext|> inside<|im_start|>words<|im_end|><|endoftext|>\n"
    "<|begin_of_text|>   leading spaces\t\ttabs  \n\n\n  trailing   \r\n\r\n"
    "numbers 1234567890 3.14159 -42 1e-5 1,000,000 ½ ²\n"
    "I'M YOU'RE WE'VE SHE'S 'tis 's 't 're 've 'm 'll 'd '' <|end_of_text|>";

// The oracle's files, made once per test program (tokenizers trains in about a second each), removed at its exit.
struct OracleDir {
  fs::path dir = fs::temp_directory_path() / ("minidl_hf_tokenizers_" + std::to_string(::getpid()));
  OracleDir() {
    const auto r =
        minidl::testing::run_program(python() + " " + MINIDL_SOURCE_DIR + "/tests/data/hf_tokenizer_oracle.py make " +
                                     dir.string() + " " + data_dir() + "/tinyshakespeare.txt 2>&1");
    if (r.code != 0) ADD_FAILURE() << r.out;
  }
  ~OracleDir() { fs::remove_all(dir); }
};

const fs::path& oracle_dir() {
  static const OracleDir made;
  return made.dir;
}

std::vector<int32_t> oracle_ids(const std::string& json, const std::string& text_file) {
  const auto r =
      minidl::testing::run_program(python() + " " + MINIDL_SOURCE_DIR + "/tests/data/hf_tokenizer_oracle.py encode " +
                                   json + " " + text_file + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<int32_t> ids;
  std::istringstream in(r.out);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// The ids around a first difference, as minidl and tokenizers have them.
std::string around(const std::vector<int32_t>& ids, size_t i) {
  std::string s;
  for (size_t k = i >= 6 ? i - 6 : 0; k < std::min(ids.size(), i + 6); ++k) s += std::to_string(ids[k]) + " ";
  return s;
}

void expect_same_ids(const BpeTokenizer& t, const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    ASSERT_EQ(got[i], want[i]) << "token " << i << " ('" << t.token_bytes(got[i]) << "' against '"
                               << t.token_bytes(want[i]) << "'): minidl " << around(got, i) << "| tokenizers "
                               << around(want, i);
  ASSERT_EQ(got.size(), want.size());
}

// GPT-2's bytes_to_unicode, derived here on its own: the printable bytes are themselves, the rest U+0100 onward.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xc0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3f)));
  }
  return s;
}

// A small byte-level BPE file: the 256 bytes, then `extra` tokens with their merges.
nlohmann::json small_file(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + int(i);
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
}

std::vector<int32_t> ids_of(const nlohmann::json& file, const std::string& text) {
  return BpeTokenizer::from_hf_json(file.dump(), "test").encode(text);
}

void expect_refused(const nlohmann::json& file, const std::vector<std::string>& words) {
  try {
    BpeTokenizer::from_hf_json(file.dump(), "tok.json");
    ADD_FAILURE() << "accepted " << file.dump().substr(0, 200);
  } catch (const minidl::Error& e) {
    const std::string what = e.what();
    for (const std::string& w : words) EXPECT_NE(what.find(w), std::string::npos) << "'" << w << "' not in: " << what;
  }
}

}  // namespace

TEST(HfTokenizer, IdsEqualTokenizersOnEveryLayout) {
  if (minidl::testing::run_program(python() + " -c 'import tokenizers'").code != 0)
    GTEST_SKIP() << python() << " has no tokenizers: scripts/install-deps.sh --with-oracles installs it";
  const fs::path stress = oracle_dir() / "stress.txt";
  std::ofstream(stress, std::ios::binary) << kStress;
  for (const char* layout : {"gpt2style", "prefix", "llama3style"}) {
    const std::string json = (oracle_dir() / (std::string(layout) + ".json")).string();
    const BpeTokenizer t = BpeTokenizer::from_hf_json_file(json);
    for (const std::string& file : {stress.string(), data_dir() + "/tinyshakespeare.txt"}) {
      SCOPED_TRACE(std::string(layout) + " on " + file);
      const std::vector<int32_t> want = oracle_ids(json, file), got = t.encode(read_bytes(file));
      expect_same_ids(t, got, want);
      // (add_prefix_space puts a space before each stretch of text between added tokens: that layout's ids spell
      // more than the text)
      if (std::string(layout) != "prefix") EXPECT_EQ(t.decode(got), read_bytes(file));
      if (std::string(layout) == "gpt2style") {  // the merges as pairs: the same tokenizer
        expect_same_ids(
            t, BpeTokenizer::from_hf_json_file((oracle_dir() / "pairs.json").string()).encode(read_bytes(file)), want);
      }
    }
  }
  const BpeTokenizer smol = BpeTokenizer::from_hf_json_file((oracle_dir() / "gpt2style.json").string());
  EXPECT_EQ(smol.size(), 2048);
  EXPECT_EQ(smol.first_special(), 0);  // <|endoftext|>, the first of the trainer's special tokens
  EXPECT_EQ(smol.token_bytes(1), "<|im_start|>");
}

// The Tokenizer a run holds: its kind, its checkpoint JSON carries the whole file, and the same ids come back.
TEST(HfTokenizer, ACheckpointCarriesTheWholeFile) {
  if (minidl::testing::run_program(python() + " -c 'import tokenizers'").code != 0)
    GTEST_SKIP() << python() << " has no tokenizers: scripts/install-deps.sh --with-oracles installs it";
  const std::string json = (oracle_dir() / "llama3style.json").string();
  const minidl::data::Tokenizer t = minidl::data::Tokenizer::hf_file(json);
  EXPECT_STREQ(t.kind(), "hf");
  EXPECT_EQ(t.size(), 3000);
  EXPECT_EQ(t.sample_start(), 0);  // <|begin_of_text|>
  ASSERT_NE(t.hf_json(), nullptr);
  EXPECT_EQ(*t.hf_json(), read_bytes(json));
  const minidl::data::Tokenizer back =
      minidl::data::Tokenizer::from_json(nlohmann::json::parse(t.to_json().dump()), "");
  EXPECT_EQ(back.encode(kStress), t.encode(kStress));
  const minidl::data::Tokenizer by_path = minidl::data::Tokenizer::from_json({{"type", "hf"}, {"file", json}}, "");
  EXPECT_EQ(by_path.encode(kStress), t.encode(kStress));
  EXPECT_EQ(minidl::data::Tokenizer::kind_of(json), "hf");
  EXPECT_THROW(minidl::data::Tokenizer::check_kind("sentencepiece"), minidl::Error);
}

// tokenizers' rule merges by the merges' order; "ignore_merges" (Llama 3's) takes a piece that is a token whole first.
// "abc" is a token, but the only merge is "a b": by the merges it is ab + c.
TEST(HfTokenizer, IgnoreMergesTakesAWholePieceFirst) {
  nlohmann::json file = small_file({"ab", "abc"}, {"a b"});
  EXPECT_EQ(ids_of(file, "abc"), (std::vector<int32_t>{256, 'c'}));
  file["model"]["ignore_merges"] = true;
  EXPECT_EQ(ids_of(file, "abc"), (std::vector<int32_t>{257}));
  // The merges' order, not the merged token's id: "b c" comes first here, so "abc" is a + bc.
  nlohmann::json order = small_file({"ab", "bc"}, {"b c", "a b"});
  EXPECT_EQ(ids_of(order, "abc"), (std::vector<int32_t>{'a', 257}));
}

TEST(HfTokenizer, EveryByteRoundTrips) {
  const BpeTokenizer t = BpeTokenizer::from_hf_json(small_file({"ab", "Ġa"}, {"a b", "Ġ a"}).dump(), "test");
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(char(b));
  all_bytes += "\xff\xfe not UTF-8 \xc3 ab a ab";
  EXPECT_EQ(t.decode(t.encode(all_bytes)), all_bytes);
  EXPECT_EQ(t.encode(" a"), (std::vector<int32_t>{257}));  // the space is Ġ (U+0120) in the file
}

TEST(HfTokenizer, UnsupportedFilesAreRefusedNamingTheField) {
  const nlohmann::json good = small_file({"ab"}, {"a b"});
  nlohmann::json f = good;
  f["model"]["byte_fallback"] = true;  // SentencePiece-style, as Llama 2's
  expect_refused(f, {"tok.json", "model.byte_fallback", "byte-level BPE"});
  f = good;
  f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  expect_refused(f, {"pre_tokenizer", "Metaspace", "ByteLevel"});
  f = good;
  f["normalizer"] = {{"type", "NFC"}};
  expect_refused(f, {"normalizer", "NFC"});
  f = good;
  f["model"]["type"] = "WordPiece";
  expect_refused(f, {"model.type", "WordPiece", "BPE"});
  f = good;
  f["model"]["merges"] = {"a c"};  // "ac" is no token
  expect_refused(f, {"model.merges[0]", "not in model.vocab"});
  f = good;
  f["model"]["vocab"]["xyz"] = 300;  // ids 257 to 299 missing
  expect_refused(f, {"id 257", "neither"});
  f = good;
  f["added_tokens"] = {{{"id", 257}, {"content", "<s>"}, {"lstrip", true}}};
  expect_refused(f, {"<s>", "lstrip"});
  expect_refused(nlohmann::json::array(), {"tok.json", "\"model\""});
  EXPECT_THROW(BpeTokenizer::from_hf_json("{not json", "tok.json"), minidl::Error);
  EXPECT_THROW(BpeTokenizer::from_hf_json_file("/nonexistent/tokenizer.json"), minidl::Error);
}
