// The safetensors header parser, apart from any file or tensor: what read_safetensors_header runs on a file's first
// bytes, and what the fuzzer (tests/fuzz/) feeds arbitrary bytes. Depends on core/dtype and nlohmann only.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "nn/safetensors.h"

namespace minidl::nn {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's MAX_HEADER_SIZE
constexpr char kMetadataKey[] = "__metadata__";

// Every reader error: names the file and the problem.
[[noreturn]] void bad_file(const std::string& path, const std::string& problem) {
  detail::throw_error(__FILE__, __LINE__, "safetensors file '" + path + "': " + problem);
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets"))
    bad_file(path, "tensor '" + name + "' needs an object with dtype, shape and data_offsets, got " + j.dump());
  SafetensorsEntry e{};
  const auto& dt = j["dtype"];
  if (!dt.is_string()) bad_file(path, "tensor '" + name + "': dtype must be a string, got " + dt.dump());
  try {
    e.dtype = dtype_from_safetensors(dt.get<std::string>());
  } catch (const Error&) {
    bad_file(path, "tensor '" + name + "': unknown dtype " + dt.dump() +
                       ", expected one of F32, F64, F16, BF16, I32, I64, U8");
  }
  const auto& shape = j["shape"];
  if (!shape.is_array() || shape.size() > size_t(Shape::kMaxDims))
    bad_file(path, "tensor '" + name + "': shape must be an array of at most 8 sizes, got " + shape.dump());
  uint64_t bytes = dtype_size(e.dtype);
  for (const auto& d : shape) {
    if (!d.is_number_unsigned())
      bad_file(path, "tensor '" + name + "': shape sizes must be non-negative integers, got " + shape.dump());
    uint64_t v = d.get<uint64_t>();
    e.shape.push_back(int64_t(v));
    if (__builtin_mul_overflow(bytes, v, &bytes))
      bad_file(path, "tensor '" + name + "': shape " + shape.dump() + " is too large");
  }
  const auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad_file(path, "tensor '" + name + "': data_offsets must be [begin, end] non-negative integers, got " + off.dump());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.end < e.begin || e.end - e.begin != bytes)
    bad_file(path, "tensor '" + name + "': data_offsets " + off.dump() + " span " + std::to_string(e.end - e.begin) +
                       " bytes, but dtype " + dt.get<std::string>() + " and shape " + shape.dump() + " need " +
                       std::to_string(bytes));
  return e;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const std::string& path, std::string_view head, uint64_t file_size) {
  if (file_size < 8 || head.size() < 8)
    bad_file(path, "file is too short (" + std::to_string(file_size) + " bytes) to hold the 8-byte header length");
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(head[size_t(b)])) << (8 * b);
  if (n > kMaxHeaderBytes) bad_file(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > file_size - 8)
    bad_file(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(file_size) + " bytes)");
  if (head.size() < 8 + n) bad_file(path, "read error in the header");
  const std::string_view text = head.substr(8, size_t(n));

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) { bad_file(path, std::string("header is not valid JSON: ") + e.what()); }
  if (!header.is_object()) bad_file(path, "header must be a JSON object, got " + std::string(header.type_name()));

  SafetensorsHeader out;
  out.data_start = 8 + n;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) bad_file(path, "__metadata__ must be an object of strings, got " + value.dump());
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) bad_file(path, "__metadata__['" + k + "'] must be a string, got " + v.dump());
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.entries[name] = parse_entry(path, name, value);
  }

  // The tensors must tile the data buffer exactly, in offset order: overlaps would alias two tensors, holes and
  // trailing bytes mean a damaged or foreign file.
  const uint64_t data_size = file_size - out.data_start;
  std::vector<const std::pair<const std::string, SafetensorsEntry>*> by_offset;
  for (const auto& kv : out.entries) by_offset.push_back(&kv);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return std::tie(a->second.begin, a->second.end) < std::tie(b->second.begin, b->second.end);
  });
  uint64_t expected_begin = 0;
  std::string prev;
  for (const auto* kv : by_offset) {
    const auto& [name, e] = *kv;
    const std::string range = detail::concat("[", e.begin, ", ", e.end, "]");
    if (e.end > data_size)
      bad_file(path, "tensor '" + name + "' data_offsets " + range + " lie outside the data buffer (" +
                         std::to_string(data_size) + " bytes)");
    if (e.begin < expected_begin) bad_file(path, "tensor '" + name + "' data_offsets " + range + " overlap " + prev);
    if (e.begin > expected_begin)
      bad_file(path, "hole in the data buffer: bytes [" + std::to_string(expected_begin) + ", " +
                         std::to_string(e.begin) + ") before tensor '" + name + "' belong to no tensor");
    expected_begin = e.end;
    prev = "tensor '" + name + "'";
  }
  if (expected_begin != data_size)
    bad_file(path, "the data buffer holds " + std::to_string(data_size) + " bytes but the tensors cover " +
                       std::to_string(expected_begin));
  return out;
}

}  // namespace minidl::nn
