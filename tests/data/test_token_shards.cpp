// Token shards in llm.c's format (data/token_shards.h): the bytes of a written shard are llm.c's layout (a header of
// 256 int32 with magic 20240520, version 1 and the count, then uint16 tokens), read back to the same tokens; bad
// shards (another magic, another version, truncated, extended) are refused naming the file; a glob's shards split
// into training and validation by their names; tokens outside the tokenizer are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/shard_sampler.h"
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
  data::write_token_shard(path("s_train_000001.bin"), std::vector<int32_t>{1, 2, 5});
  const data::Tokenizer chars = data::Tokenizer::chars_of("abcdefghij");  // 10 ids
  const data::TextDataset ds = data::TextDataset::from_shards(path("s_*.bin"), chars);
  EXPECT_EQ(ds.train_shards(), (std::vector<std::string>{path("s_train_000001.bin"), path("s_train_000002.bin")}));
  EXPECT_TRUE(ds.train().empty()) << "training shards stay on disk";
  EXPECT_EQ(ds.train_tokens(), 5);
  EXPECT_EQ(ds.val(), (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(data::names_token_shards(path("s_*.bin")));
  EXPECT_TRUE(data::names_token_shards("x.bin"));
  EXPECT_FALSE(data::names_token_shards("data/tinyshakespeare.txt"));
  try {
    data::TextDataset::from_shards(path("s_train_*.bin"), chars);
    ADD_FAILURE() << "no validation shard was accepted";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("found 2 and 0"), std::string::npos) << e.what(); }
  EXPECT_THROW(data::TextDataset::from_shards(path("nothing_*.bin"), chars), Error);
  data::write_token_shard(path("s_val_000003.bin"), std::vector<int32_t>{10});
  try {
    data::TextDataset::from_shards(path("s_*.bin"), chars);
    ADD_FAILURE() << "token 10 of a 10-id tokenizer was accepted";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("token 0 is 10"), std::string::npos) << e.what(); }
}

// The streaming sampler: a step's global batch is a function of (seed, step) alone (the same whatever was drawn
// before, whichever shard is loaded, however the rows are split), each row a window of the shard with its targets
// one token ahead, every window of every shard used once per epoch, shards visited in an order that changes with
// the epoch; a shard too small for one global batch, and a token outside the vocabulary, named.
TEST_F(TokenShards, StreamingSamplerIsAFunctionOfTheStep) {
  const int64_t seq = 4, B = 3;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    std::vector<int32_t> tokens(size_t(seq * (7 + f) + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(1000 * f + i);  // the token says where it is
    files.push_back(path("t_train_" + std::to_string(f) + ".bin"));
    data::write_token_shard(files.back(), tokens);
  }
  data::ShardSampler a(files, seq, B, 5), b(files, seq, B, 5);
  EXPECT_EQ(a.steps_per_epoch(), 2 + 2 + 3);  // floor(7/3) + floor(8/3) + floor(9/3)
  const int64_t steps = 3 * a.steps_per_epoch();
  std::vector<std::vector<double>> forward;
  for (int64_t s = 0; s < steps; ++s) forward.push_back(a.batch(s, 0, B).x.to_vector());
  for (int64_t s = steps - 1; s >= 0; --s) {  // backwards, in two slices: the same rows
    const data::Batch lo = b.batch(s, 0, 1), hi = b.batch(s, 1, 2);
    std::vector<double> x = lo.x.to_vector(), more = hi.x.to_vector();
    x.insert(x.end(), more.begin(), more.end());
    EXPECT_EQ(x, forward[size_t(s)]) << "step " << s;
  }
  std::vector<std::string> first_shards;
  for (int64_t e = 0; e < 3; ++e) {
    std::set<double> starts;
    for (int64_t s = e * a.steps_per_epoch(); s < (e + 1) * a.steps_per_epoch(); ++s) {
      const data::Batch batch = a.batch(s, 0, B);
      const std::vector<double> x = batch.x.to_vector(), y = batch.y.to_vector();
      for (int64_t r = 0; r < B; ++r) {
        EXPECT_TRUE(starts.insert(x[size_t(r * seq)]).second) << "a window twice in epoch " << e;
        EXPECT_EQ(int64_t(x[size_t(r * seq)]) % 1000 % seq, 0) << "windows start at multiples of seq";
        for (int64_t i = 0; i < seq; ++i) EXPECT_EQ(y[size_t(r * seq + i)], x[size_t(r * seq + i)] + 1);
      }
    }
    first_shards.push_back(a.shard_of(e * a.steps_per_epoch()));
  }
  EXPECT_FALSE(first_shards[0] == first_shards[1] && first_shards[1] == first_shards[2]) << "the order is drawn";
  data::write_token_shard(path("small_train.bin"), std::vector<int32_t>(size_t(seq * 2 + 1), 1));
  try {
    data::ShardSampler small({path("small_train.bin")}, seq, B, 5);
    ADD_FAILURE() << "a shard of 2 windows served a batch of 3";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("small_train.bin"), std::string::npos) << e.what(); }
  data::ShardSampler checked(files, seq, B, 5, /*vocab=*/500);  // shards 1 and 2 hold tokens from 1000 on
  std::string refused;
  for (int64_t s = 0; s < checked.steps_per_epoch() && refused.empty(); ++s) {
    try {
      checked.batch(s, 0, B);
    } catch (const Error& e) { refused = e.what(); }
  }
  EXPECT_NE(refused.find("not one of the tokenizer's 500 ids"), std::string::npos) << refused;
  EXPECT_NE(refused.find("t_train_"), std::string::npos) << refused;
}

}  // namespace
