#include "nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "autograd/node.h"
#include "nn/atomic_file.h"

namespace minidl::nn {

// Tensor data is copied to and from the file as raw bytes, which is only the format's little-endian on such hosts.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's MAX_HEADER_SIZE
constexpr char kMetadataKey[] = "__metadata__";

using ordered_json = nlohmann::ordered_json;

// Every reader error: names the file and the problem.
[[noreturn]] void bad_file(const std::string& path, const std::string& problem) {
  detail::throw_error(__FILE__, __LINE__, "safetensors file '" + path + "': " + problem);
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  // Validate and gather everything before the file is opened, so a bad argument never touches the disk.
  std::set<std::string> names;
  std::vector<Tensor> data;
  for (const auto& [name, t] : tensors) {
    MINIDL_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors('", path, "'): invalid tensor name '", name,
                 "'");
    MINIDL_CHECK(names.insert(name).second, "save_safetensors('", path, "'): duplicate tensor name '", name, "'");
    MINIDL_CHECK(t.defined(), "save_safetensors('", path, "'): tensor '", name, "' is undefined");
    autograd::NoGradGuard no_grad;
    data.push_back(t.to(Device::cpu()).contiguous());
  }

  // Largest element size first, then by name (the reference writer's order): every tensor starts at a multiple
  // of its element size, so a reader can map it in place.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    size_t sa = dtype_size(data[a].dtype()), sb = dtype_size(data[b].dtype());
    return sa != sb ? sa > sb : tensors[a].first < tensors[b].first;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (size_t i : order) {
    const Tensor& t = data[i];
    uint64_t end = offset + t.nbytes();
    header[tensors[i].first] = {
        {"dtype", dtype_info(t.dtype()).safetensors}, {"shape", t.shape().vec()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // so the data buffer starts 8-byte aligned

  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = uint8_t(uint64_t(text.size()) >> (8 * b));
  AtomicFile file(path);
  file.write(len, 8);
  file.write(text.data(), text.size());
  for (size_t i : order) file.write(data[i].raw_data(), data[i].nbytes());
  file.commit();
}

namespace {

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

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) bad_file(path, "cannot read: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_file(path, "cannot open for reading");
  if (file_size < 8)
    bad_file(path, "file is too short (" + std::to_string(file_size) + " bytes) to hold the 8-byte header length");

  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(len[b]) << (8 * b);
  if (n > kMaxHeaderBytes) bad_file(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > file_size - 8)
    bad_file(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(file_size) + " bytes)");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  if (!in) bad_file(path, "read error in the header");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, std::string("header is not valid JSON: ") + e.what());
  }
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

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsHeader header = read_safetensors_header(path);
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "safetensors file '", path, "': cannot open for reading");
  for (const auto& [name, e] : header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.seekg(std::streamoff(header.data_start + e.begin));
    in.read(static_cast<char*>(t.raw_data()), std::streamsize(e.end - e.begin));
    MINIDL_CHECK(in.good(), "safetensors file '", path, "': read error in tensor '", name, "'");
    out.tensors.emplace(name, t);
  }
  return out;
}

}  // namespace minidl::nn
