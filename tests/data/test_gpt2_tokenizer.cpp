// GPT-2's byte-level BPE (data/bpe_tokenizer.h) against its published figures and against tiktoken. The shipped
// corpus split 90/10 by characters gives GPT-2's 301,966 train and 36,059 validation tokens, the train split
// starting 5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11 (../shared/data/README.md: tiktoken's counts); a
// stress text (accents, CJK, emoji, whitespace runs, digits, contractions, <|endoftext|> as text) gives tiktoken's
// ids, computed at test time by tiktoken itself when the oracles' environment has it (scripts/install-deps.sh
// --with-oracles); decode(encode(x)) == x for every text, bytes that are not UTF-8 included; a malformed encoding
// file is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "corpus.h"
#include "support/run_program.h"

namespace fs = std::filesystem;
using minidl::data::BpeTokenizer;

namespace {

using minidl::testing::data_dir;
using minidl::testing::read_bytes;

const BpeTokenizer& tokenizer() {
  static const BpeTokenizer t = BpeTokenizer::gpt2(std::string(MINIDL_SOURCE_DIR) + "/data/gpt2.tiktoken");
  return t;
}

// Unicode code points of a UTF-8 text (the corpus is ASCII: its characters are its bytes, but the count must not
// depend on that).
size_t characters(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

const char* kStress =
    "Hello, world! It's 2026; they'll say we'd've... naïve café Ünïcödé — «quotes» ‘single’ “double”\n"
    "日本語のテキスト 中文文本 한국어 текст на русском ελληνικά עברית العربية\n"
    "emoji: 👩‍💻🚀🎉 flags 🇫🇷 skin 👍🏽 and <|endoftext|> as plain text\n"
    "   leading spaces\t\ttabs  \n\n\n  trailing   \r\n"
    "numbers 1234567890 3.14159 -42 1e-5 0x1F 1,000,000 ½ ² ١٢٣\n"
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // done\n"
    "ALLCAPS MixedCase camelCaseWords snake_case_words   \u00a0nbsp\u2003emspace\n"
    "I'M YOU'RE WE'VE SHE'S 'tis 's 't 're 've 'm 'll 'd ''\n";

}  // namespace

TEST(Gpt2Tokenizer, ShippedCorpusGivesGpt2sCountsAndFirstIds) {
  const std::string corpus = read_bytes(data_dir() + "/tinyshakespeare.txt");
  ASSERT_EQ(corpus.size(), 1115394u);
  // nanoGPT's split: the first 90% of the characters (here: bytes, the corpus being ASCII) for training.
  const size_t cut = size_t(double(characters(corpus)) * 0.9);
  const std::vector<int32_t> train = tokenizer().encode(std::string_view(corpus).substr(0, cut));
  const std::vector<int32_t> val = tokenizer().encode(std::string_view(corpus).substr(cut));
  EXPECT_EQ(train.size(), 301966u);
  EXPECT_EQ(val.size(), 36059u);
  const std::vector<int32_t> first(train.begin(), train.begin() + 10);
  EXPECT_EQ(first, (std::vector<int32_t>{5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11}));
  EXPECT_EQ(tokenizer().decode(train) + tokenizer().decode(val), corpus);
}

TEST(Gpt2Tokenizer, KnownIdsAndSpecialToken) {
  EXPECT_EQ(tokenizer().size(), 50257);
  EXPECT_EQ(tokenizer().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer().encode(""), std::vector<int32_t>{});
  EXPECT_EQ(tokenizer().decode(std::vector<int32_t>{BpeTokenizer::kGpt2EndOfText}), "<|endoftext|>");
  EXPECT_THROW(tokenizer().decode(std::vector<int32_t>{50257}), minidl::Error);
  EXPECT_THROW(tokenizer().decode(std::vector<int32_t>{-1}), minidl::Error);
}

// Bytes that are not UTF-8 (a lone continuation byte, a truncated sequence, an overlong form, 0xFF) survive the
// round trip, alone and between words.
TEST(Gpt2Tokenizer, RoundTripsEveryTextIncludingInvalidUtf8) {
  const std::vector<std::string> texts = {kStress,
                                          "\x80",
                                          "ab\xff\xfe"
                                          "cd",
                                          "caf\xc3",
                                          "\xe6\x97 x",
                                          "\xc0\xaf",
                                          std::string("nul\0byte", 8),
                                          " \xff \xff\xff  word\xfe"};
  for (const std::string& t : texts) EXPECT_EQ(tokenizer().decode(tokenizer().encode(t)), t) << t;
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(char(b));
  EXPECT_EQ(tokenizer().decode(tokenizer().encode(all_bytes)), all_bytes);
}

// The same ids as tiktoken (the real client, run here on the same encoding file) on the stress text and on the
// whole corpus.
TEST(Gpt2Tokenizer, IdsEqualTiktokens) {
  const char* venv = std::getenv("MINIDL_ORACLES_VENV");
  const std::string python = std::string(venv ? venv : "/opt/minidl-oracles") + "/bin/python";
  if (minidl::testing::run_program(python + " -c 'import tiktoken'").code != 0)
    GTEST_SKIP() << python << " has no tiktoken: scripts/install-deps.sh --with-oracles installs it";
  const fs::path stress = fs::temp_directory_path() / ("minidl_gpt2_stress_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(stress, std::ios::binary) << kStress;
  for (const std::string& file : {stress.string(), data_dir() + "/tinyshakespeare.txt"}) {
    SCOPED_TRACE(file);
    const minidl::testing::ProgramResult r =
        minidl::testing::run_program(python + " " + MINIDL_SOURCE_DIR + "/tests/data/tiktoken_ids.py " +
                                     MINIDL_SOURCE_DIR + "/data/gpt2.tiktoken " + file + " 2>&1");
    ASSERT_EQ(r.code, 0) << r.out;
    std::vector<int32_t> want;
    std::istringstream in(r.out);
    for (int32_t id; in >> id;) want.push_back(id);
    const std::vector<int32_t> got = tokenizer().encode(read_bytes(file));
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      ASSERT_EQ(got[i], want[i]) << "token " << i << " ('" << tokenizer().token_bytes(got[i]) << "' against '"
                                 << tokenizer().token_bytes(want[i]) << "')";
    ASSERT_EQ(got.size(), want.size());
  }
  fs::remove(stress);
}

TEST(Gpt2Tokenizer, MalformedEncodingFilesAreRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / ("minidl_gpt2_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto refused = [&](const std::string& name, const std::string& contents, const std::string& part) {
    std::ofstream((dir / name).string(), std::ios::binary) << contents;
    try {
      BpeTokenizer::gpt2((dir / name).string());
      ADD_FAILURE() << name << " was accepted";
    } catch (const minidl::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  refused("missing.tiktoken", "", "expected 50256 ranks");
  refused("bad_base64.tiktoken", "IQ== 0\n!!!! 1\n", "line 2: expected 'BASE64 RANK' with rank 1");
  refused("out_of_order.tiktoken", "IQ== 0\nIg== 2\n", "line 2: expected 'BASE64 RANK' with rank 1");
  refused("twice.tiktoken", "IQ== 0\nIQ== 1\n", "the bytes of rank 1 already have a rank");
  EXPECT_THROW(BpeTokenizer::gpt2((dir / "absent.tiktoken").string()), minidl::Error);
  fs::remove_all(dir);
}

// The parallel encoding cuts the text only where the pattern ends a piece: the ids are the serial ones, for every
// thread count, on the corpus (blank lines between speeches) and on the stress text.
TEST(Gpt2Tokenizer, ParallelEncodingIsTheSerialOne) {
  const std::string corpus = read_bytes(data_dir() + "/tinyshakespeare.txt");
  const std::vector<int32_t> serial = tokenizer().encode(corpus);
  for (int threads : {1, 2, 3, 8}) EXPECT_EQ(tokenizer().encode_parallel(corpus, threads), serial) << threads;
  const std::string stress = std::string(kStress) + "\n\n" + kStress + "\n\n\n  " + kStress;
  EXPECT_EQ(tokenizer().encode_parallel(stress, 4), tokenizer().encode(stress));
}
