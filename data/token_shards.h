// Token shards in llm.c's format: a header of 256 little-endian int32 (magic 20240520, version 1, the token count,
// the rest zero), then the tokens as little-endian uint16. Shards written by llm.c's data scripts (fineweb.py,
// tinyshakespeare.py) load unchanged; by llm.c's convention a shard whose file name contains "val" holds validation
// tokens and every other one training tokens.
//
//   data::write_token_shard("out/shakespeare_train_000001.bin", ids);   // ids < 65536
//   std::vector<int32_t> ids = data::read_token_shard("out/shakespeare_train_000001.bin");
//   std::vector<std::string> files = data::shard_files("out/*.bin");    // sorted; none is an error
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace minidl::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int64_t kShardHeaderInts = 256;

// Writes `tokens` as one shard, atomically (a temporary file renamed into place). Throws naming a token that does
// not fit in 16 bits, or the file that cannot be written.
void write_token_shard(const std::string& path, std::span<const int32_t> tokens);

// A shard's tokens. Throws naming the file and what is wrong: not a shard (magic), another version, a size that
// does not match the header's count (truncated or extended).
std::vector<int32_t> read_token_shard(const std::string& path);

// The token count in a shard's header, the header checked as read_token_shard checks it (the tokens not read).
int64_t shard_token_count(const std::string& path);

// The files matching a glob pattern (glob(3): *, ?, [...]), sorted by name; throws when none matches.
std::vector<std::string> shard_files(const std::string& pattern);

// Whether `data` names shards rather than a text file: it holds a glob character or ends in ".bin".
bool names_token_shards(const std::string& data);

// llm.c's convention: a file name (not its folder) containing "val" is a validation shard.
bool is_validation_shard(const std::string& path);

}  // namespace minidl::data
