#include "data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace minidl::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian, as llm.c writes them");

void write_token_shard(const std::string& path, std::span<const int32_t> tokens) {
  std::vector<int32_t> header(size_t(kShardHeaderInts), 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  MINIDL_CHECK(tokens.size() <= size_t(INT32_MAX), "token shard ", path, ": ", tokens.size(),
               " tokens do not fit the header's int32 count");
  header[2] = int32_t(tokens.size());
  std::vector<uint16_t> body(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    MINIDL_CHECK(tokens[i] >= 0 && tokens[i] < 65536, "token shard ", path, ": token ", i, " is ", tokens[i],
                 ", outside the 16 bits a shard stores (0 to 65535)");
    body[i] = uint16_t(tokens[i]);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MINIDL_CHECK(out.good(), "token shard ", path, ": cannot write ", tmp);
    out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size() * sizeof(int32_t)));
    out.write(reinterpret_cast<const char*>(body.data()), std::streamsize(body.size() * sizeof(uint16_t)));
    out.flush();
    MINIDL_CHECK(out.good(), "token shard ", path, ": writing ", tmp, " failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MINIDL_CHECK(!ec, "token shard ", path, ": cannot rename ", tmp, " into place: ", ec.message());
}

namespace {

// Opens `path`, reads and checks its header (against the file's size too); returns the token count.
int64_t read_header(const std::string& path, std::ifstream& in) {
  MINIDL_CHECK(in.good(), "token shard ", path, ": cannot open the file");
  std::vector<int32_t> header(size_t(kShardHeaderInts), 0);
  in.read(reinterpret_cast<char*>(header.data()), std::streamsize(header.size() * sizeof(int32_t)));
  MINIDL_CHECK(in.gcount() == std::streamsize(header.size() * sizeof(int32_t)), "token shard ", path, ": ", in.gcount(),
               " bytes, shorter than the 1024-byte header");
  MINIDL_CHECK(header[0] == kShardMagic, "token shard ", path, ": expected the magic number ", kShardMagic,
               " (llm.c's format), got ", header[0]);
  MINIDL_CHECK(header[1] == kShardVersion, "token shard ", path, ": expected version ", kShardVersion, ", got ",
               header[1]);
  MINIDL_CHECK(header[2] >= 0, "token shard ", path, ": a negative token count, ", header[2]);
  const uint64_t want = uint64_t(kShardHeaderInts) * 4 + uint64_t(header[2]) * 2,
                 have = uint64_t(std::filesystem::file_size(path));
  MINIDL_CHECK(have == want, "token shard ", path, ": the header counts ", header[2], " tokens (", want,
               " bytes with the header), the file has ", have, " bytes", have < want ? " (truncated)" : "");
  return header[2];
}

}  // namespace

int64_t shard_token_count(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return read_header(path, in);
}

std::vector<int32_t> read_token_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint16_t> body(static_cast<size_t>(read_header(path, in)));
  in.read(reinterpret_cast<char*>(body.data()), std::streamsize(body.size() * sizeof(uint16_t)));
  MINIDL_CHECK(in.gcount() == std::streamsize(body.size() * sizeof(uint16_t)), "token shard ", path,
               ": reading its tokens failed");
  return std::vector<int32_t>(body.begin(), body.end());
}

std::vector<std::string> shard_files(const std::string& pattern) {
  glob_t found{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < found.gl_pathc; ++i) files.emplace_back(found.gl_pathv[i]);
  globfree(&found);
  MINIDL_CHECK(!files.empty(), "--data ", pattern,
               ": no file matches (expected token shards, e.g. "
               "'out/shakespeare_*.bin', from tokenize_shards or llm.c's data scripts)");
  std::sort(files.begin(), files.end());
  return files;
}

bool names_token_shards(const std::string& data) {
  return data.find_first_of("*?[") != std::string::npos ||
         (data.size() >= 4 && data.compare(data.size() - 4, 4, ".bin") == 0);
}

bool is_validation_shard(const std::string& path) {
  return std::filesystem::path(path).filename().string().find("val") != std::string::npos;
}

}  // namespace minidl::data
