// Reading and writing safetensors files (https://github.com/huggingface/safetensors), the checkpoint format that
// PyTorch / Hugging Face users load directly.
//
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  JSON header, padded with spaces so the data starts 8-byte aligned:
//              {"__metadata__": {"format": "pt"},
//               "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
//   [rest]     raw little-endian row-major tensor data; offsets are relative to the start of this buffer
//
//   save_safetensors("model.safetensors", model.named_parameters(), {{"format", "pt"}});
//   SafetensorsFile f = load_safetensors("model.safetensors");   // f.tensors.at("transformer.wte.weight")
//
// The writer follows the reference implementation (tensors ordered by dtype size, largest first, then by name, so
// every tensor is naturally aligned; "__metadata__" first in the header), writes to `path + ".tmp"` and renames it
// over `path` only when complete: a failed save never leaves a half-written file or clobbers an existing one.
// The reader validates as the reference does: every tensor's byte size matches dtype x shape and the tensors tile
// the data buffer exactly (no overlap, no hole, nothing after the last one). Errors name the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace minidl::nn {

using Metadata = std::map<std::string, std::string>;  // safetensors metadata values are strings only

struct SafetensorsEntry {
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range within the data buffer
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> entries;
  Metadata metadata;
  uint64_t data_start = 0;  // file offset of the data buffer (8 + N)
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // contiguous CPU tensors
  Metadata metadata;
};

// Writes `tensors` (any device, layout and dtype; names unique) and `metadata` to `path`.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Reads and validates the header only (cheap: use it to inspect a checkpoint's config without its data).
SafetensorsHeader read_safetensors_header(const std::string& path);

// The parser read_safetensors_header runs: `head` is the file's first bytes (the 8-byte length and the JSON header
// it announces), file_size the whole file's size; `path` only names the file in messages. Any input gives a
// SafetensorsHeader or a minidl::Error (fuzzed: tests/fuzz/).
SafetensorsHeader parse_safetensors_header(const std::string& path, std::string_view head, uint64_t file_size);
// Reads the whole file into CPU tensors (allocated under the caller's current memory tag).
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace minidl::nn
