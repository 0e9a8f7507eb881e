// Token shards in llm.c's format (data/token_shards.h): the bytes of a written shard are llm.c's layout (a header of
// 256 int32 with magic 20240520, version 1 and the count, then uint16 tokens), read back to the same tokens; bad
// shards (another magic, another version, truncated, extended) are refused naming the file; a glob's shards split
// into training and validation by their names; tokens outside the tokenizer are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/text_dataset.h"
#include "data/token_shards.h"

namespace fs = std::filesystem;
using namespace minidl;

namespace {

class TokenShards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("minidl_shards_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void expect_refused(const std::string& file, const std::string& part) {
    try {
      data::read_token_shard(file);
      ADD_FAILURE() << file << " was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

TEST_F(TokenShards, LlmcLayoutRoundTrips) {
  const std::vector<int32_t> tokens{50256, 0, 1, 65535, 12345, 198};
  data::write_token_shard(path("a.bin"), tokens);
  const std::string b = bytes(path("a.bin"));
  ASSERT_EQ(b.size(), 1024u + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, b.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], int32_t(tokens.size()));
  for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(b[i], 0) << "header byte " << i;
  uint16_t first;
  std::memcpy(&first, b.data() + 1024, 2);
  EXPECT_EQ(first, 50256);
  EXPECT_EQ(data::read_token_shard(path("a.bin")), tokens);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
  EXPECT_THROW(data::write_token_shard(path("big.bin"), std::vector<int32_t>{65536}), Error);
  EXPECT_FALSE(fs::exists(path("big.bin")));
}

TEST_F(TokenShards, BadShardsAreRefusedByName) {
  data::write_token_shard(path("good.bin"), std::vector<int32_t>{1, 2, 3});
  const std::string good = bytes(path("good.bin"));
  auto write = [&](const std::string& name, std::string contents) {
    std::ofstream(path(name), std::ios::binary) << contents;
    return path(name);
  };
  std::string magic = good;
  magic[0] = 1;
  expect_refused(write("magic.bin", magic), "expected the magic number 20240520");
  std::string version = good;
  version[4] = 2;
  expect_refused(write("version.bin", version), "expected version 1, got 2");
  expect_refused(write("truncated.bin", good.substr(0, good.size() - 1)), "(truncated)");
  expect_refused(write("extended.bin", good + "xx"), "the header counts 3 tokens");
  expect_refused(write("short.bin", good.substr(0, 100)), "shorter than the 1024-byte header");
}

TEST_F(TokenShards, AGlobSplitsIntoTrainingAndValidationByName) {
  data::write_token_shard(path("s_val_000000.bin"), std::vector<int32_t>{7, 8});
  data::write_token_shard(path("s_train_000002.bin"), std::vector<int32_t>{3, 4});
  data::write_token_shard(path("s_train_000001.bin"), std::vector<int32_t>{1, 2});
  const data::Tokenizer chars = data::Tokenizer::chars_of("abcdefghij");  // 10 ids
  const data::TextDataset ds = data::TextDataset::from_shards(path("s_*.bin"), chars);
  EXPECT_EQ(ds.train(), (std::vector<int32_t>{1, 2, 3, 4}));  // in name order
  EXPECT_EQ(ds.val(), (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(data::names_token_shards(path("s_*.bin")));
  EXPECT_TRUE(data::names_token_shards("x.bin"));
  EXPECT_FALSE(data::names_token_shards("data/tinyshakespeare.txt"));
  try {
    data::TextDataset::from_shards(path("s_train_*.bin"), chars);
    ADD_FAILURE() << "no validation shard was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("found 2 and 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(data::TextDataset::from_shards(path("nothing_*.bin"), chars), Error);
  data::write_token_shard(path("s_train_000003.bin"), std::vector<int32_t>{10});
  try {
    data::TextDataset::from_shards(path("s_*.bin"), chars);
    ADD_FAILURE() << "token 10 of a 10-id tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 0 is 10"), std::string::npos) << e.what();
  }
}

}  // namespace
