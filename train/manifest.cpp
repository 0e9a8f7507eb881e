#include "train/manifest.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace minidl::train {

Manifest parse_manifest(const std::string& path, std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, "checkpoint ", path, ": not valid JSON (", e.what(), ")");
  }
  MINIDL_CHECK(j.is_object(), "checkpoint ", path, ": expected a JSON object of files, got ", j.type_name());
  Manifest m;
  for (const auto& [file, e] : j.items()) {
    MINIDL_CHECK(e.is_object() && e.contains("bytes") && e["bytes"].is_number_unsigned() && e.contains("fnv1a64") &&
                     e["fnv1a64"].is_string(),
                 "checkpoint ", path, ": the entry for ", file,
                 " must be {\"bytes\": <non-negative integer>, \"fnv1a64\": \"<16 hex digits>\"}, got ", e.dump());
    const std::string sum = e["fnv1a64"].get<std::string>();
    MINIDL_CHECK(sum.size() == 16 && sum.find_first_not_of("0123456789abcdef") == std::string::npos, "checkpoint ",
                 path, ": the checksum of ", file, " must be 16 lowercase hex digits, got '", sum, "'");
    m[file] = {e["bytes"].get<uint64_t>(), sum};
  }
  return m;
}

std::string manifest_json(const Manifest& manifest) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [file, e] : manifest) j[file] = {{"bytes", e.bytes}, {"fnv1a64", e.fnv1a64}};
  return j.dump(2);
}

std::string fnv1a64_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in, "checkpoint: cannot read ", path);
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ uint8_t(buf[size_t(i)])) * 1099511628211ull;
  }
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)h);
  return s;
}

}  // namespace minidl::train
