#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

using namespace minidl;
using minidl::testing::expect_error_containing;

TEST(CharTokenizer, RoundTripOnTheCorpus) {
  std::string path = minidl::testing::corpus_path();
  std::string text = data::read_text_file(path);
  auto tok = data::CharTokenizer::from_text(text);
  EXPECT_EQ(tok.size(), 65);
  EXPECT_EQ(tok.vocab().front(), '\n');
  EXPECT_EQ(tok.vocab()[1], ' ');
  std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(CharTokenizer, IdsAreRanksOfSortedBytes) {
  auto tok = data::CharTokenizer::from_text("hello");
  EXPECT_EQ(tok.vocab(), (std::vector<uint8_t>{'e', 'h', 'l', 'o'}));
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{1, 0, 2, 2, 3}));
}

TEST(CharTokenizer, UnknownByteAndBadIdAreNamed) {
  auto tok = data::CharTokenizer::from_text("abc");
  expect_error_containing([&] { tok.encode("abz"); }, "0x7a 'z'", "position 2", "3 bytes");
  expect_error_containing([&] { tok.encode(std::string("a\x01", 2)); }, "0x01", "position 1");
  std::vector<int32_t> bad{0, 3};
  expect_error_containing([&] { tok.decode(bad); }, "id 3", "[0, 3)");
}

TEST(CharTokenizer, JsonRoundTrip) {
  auto tok = data::CharTokenizer::from_text(std::string("\xff\n hi\x00", 6));
  nlohmann::json j = nlohmann::json::parse(tok.to_json().dump());
  EXPECT_EQ(j["type"], "char");
  auto back = data::CharTokenizer::from_json(j);
  EXPECT_EQ(back.vocab(), tok.vocab());
  EXPECT_EQ(back.encode("hi\xff"), tok.encode("hi\xff"));
}

TEST(CharTokenizer, RejectsBadVocabularies) {
  using nlohmann::json;
  EXPECT_THROW(data::CharTokenizer::from_json(json{{"type", "bpe"}, {"vocab", {1, 2}}}), Error);
  EXPECT_THROW(data::CharTokenizer::from_json(json{{"type", "char"}, {"vocab", {1, 300}}}), Error);
  expect_error_containing(
      [] {
        data::CharTokenizer::from_json(json{{"type", "char"}, {"vocab", {66, 65}}});
      },
      "strictly increasing", "0x41 'A'");
  EXPECT_THROW(data::CharTokenizer::from_text(""), Error);
}
