// libFuzzer target for the readers a checkpoint passes through before anything is trusted: the safetensors header
// parser (nn::parse_safetensors_header) and the training checkpoint's manifest parser (train::parse_manifest).
// The first byte picks the reader; the rest is its input. Every input must end in a result or a minidl::Error:
// a crash, a sanitizer report, or any other exception escaping (the JSON library's, the standard library's) is a
// finding. scripts/fuzz.sh builds it with clang (-fsanitize=fuzzer,address,undefined) and runs it from the corpus
// in tests/fuzz/corpus/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "nn/safetensors.h"
#include "train/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      // The file is the input itself: its size is the input's, as read_safetensors_header would see it.
      minidl::nn::parse_safetensors_header("fuzz.safetensors", input, input.size());
    } else {
      minidl::train::parse_manifest("fuzz/manifest.json", input);
    }
  } catch (const minidl::Error&) {
    // Refused with a message: what bad input must get.
  }
  return 0;
}
