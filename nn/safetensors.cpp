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

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) bad_file(path, "cannot read: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_file(path, "cannot open for reading");
  // The 8-byte length, then as much of the header as it announces (capped: the parser names a length that runs
  // past the end of the file or over the limit).
  std::string head(size_t(std::min<uint64_t>(file_size, 8)), '\0');
  in.read(head.data(), std::streamsize(head.size()));
  if (head.size() == 8) {
    uint64_t n = 0;
    for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(head[size_t(b)])) << (8 * b);
    if (n <= kMaxHeaderBytes && n <= file_size - 8) {
      head.resize(8 + size_t(n));
      in.read(head.data() + 8, std::streamsize(n));
      if (!in) bad_file(path, "read error in the header");
    }
  }
  return parse_safetensors_header(path, head, file_size);
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
