#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/text_dataset.h"
#include "data_test_util.h"

using namespace minidl;
using minidl::testing::expect_error_containing;

TEST(TextDataset, TinyShakespeareSplit) {
  std::string path = minidl::testing::corpus_path();
  data::TextDataset ds(path);
  EXPECT_EQ(ds.tokenizer().size(), 65);
  EXPECT_EQ(ds.train().size(), 1003854u);  // floor(0.9 * 1,115,394)
  EXPECT_EQ(ds.val().size(), 111540u);
  std::vector<int32_t> all = ds.train();
  all.insert(all.end(), ds.val().begin(), ds.val().end());
  EXPECT_EQ(ds.tokenizer().decode(all), data::read_text_file(path));  // train first, then val, nothing lost
}

TEST(TextDataset, SplitIsFloorOfNineTenths) {
  minidl::testing::TempDir dir;
  for (int n : {1, 9, 10, 19, 20, 101}) {
    data::TextDataset ds(dir.write("t.txt", std::string(size_t(n), 'x')));
    EXPECT_EQ(ds.train().size(), size_t(n) * 9 / 10) << "n = " << n;
    EXPECT_EQ(ds.train().size() + ds.val().size(), size_t(n));
  }
}

TEST(TextDataset, MissingAndEmptyFilesAreNamed) {
  minidl::testing::TempDir dir;
  std::string missing = dir.file("nope.txt");
  expect_error_containing([&] { data::TextDataset ds(missing); }, missing, "does not exist");
  std::string empty = dir.write("empty.txt", "");
  expect_error_containing([&] { data::TextDataset ds(empty); }, empty, "is empty");
}

// GPT-2's tokens: nanoGPT's split of the corpus at 90% of its characters, each part encoded alone, gives GPT-2's
// published 301,966 train and 36,059 validation tokens, and decodes back to the corpus.
TEST(TextDataset, Gpt2SplitsAtNinetyPercentOfTheCharacters) {
  const std::string path = minidl::testing::corpus_path();
  data::TextDataset ds(path, data::Tokenizer::gpt2(std::string(MINIDL_SOURCE_DIR) + "/data/gpt2.tiktoken"));
  EXPECT_EQ(std::string(ds.tokenizer().kind()), "gpt2");
  EXPECT_EQ(ds.tokenizer().size(), 50257);
  EXPECT_EQ(ds.train().size(), 301966u);
  EXPECT_EQ(ds.val().size(), 36059u);
  EXPECT_EQ(ds.tokenizer().decode(ds.train()) + ds.tokenizer().decode(ds.val()), data::read_text_file(path));
  EXPECT_EQ(ds.tokenizer().sample_start(), data::BpeTokenizer::kGpt2EndOfText);
  EXPECT_EQ(data::Tokenizer::from_json(ds.tokenizer().to_json(), std::string(MINIDL_SOURCE_DIR) + "/data/gpt2.tiktoken")
                .kind(),
            std::string("gpt2"));
}
