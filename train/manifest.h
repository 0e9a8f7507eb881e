// A training checkpoint's manifest.json: each file of the checkpoint with its size and FNV-1a 64 checksum.
//
//   {"model.safetensors": {"bytes": 123, "fnv1a64": "a1b2c3d4e5f60718"}, ...}
//
// The parser is apart from any file so the fuzzer (tests/fuzz/) can feed it arbitrary bytes: any input gives a
// Manifest or a minidl::Error naming `path` and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace minidl::train {

struct ManifestEntry {
  uint64_t bytes = 0;
  std::string fnv1a64;  // 16 lowercase hex digits
};
using Manifest = std::map<std::string, ManifestEntry>;

Manifest parse_manifest(const std::string& path, std::string_view text);
std::string manifest_json(const Manifest& manifest);

// FNV-1a 64 of a file's bytes, as 16 lowercase hex digits: enough to catch truncation and corruption (not an
// adversary), in a few lines.
std::string fnv1a64_of_file(const std::string& path);

}  // namespace minidl::train
