// Which gradients travel together: DDP's bucket assignment, a pure function so it can be tested on its own.
//
// Gradients become ready roughly in reverse order of registration (backward runs the model from the loss back to
// the embeddings), so parameters are assigned in reverse registration order: the first bucket fills, and can start
// its all-reduce, while backward is still working through the early layers. The first bucket is small (1 MiB) so
// communication starts early; the others are capped (25 MiB), PyTorch's defaults. A bucket holds one dtype
// (it is one flat buffer); a parameter larger than the cap gets a bucket of its own.
//
//   auto buckets = assign_buckets({{4096, DType::f32}, {64, DType::f32}}, {.bucket_cap_bytes = 1 << 20});
//   // buckets[0].params == {1, 0}: the last-registered parameter first
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace minidl::dist {

inline constexpr size_t kDefaultBucketCapBytes = size_t(25) << 20;
inline constexpr size_t kDefaultFirstBucketCapBytes = size_t(1) << 20;

struct BucketCaps {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;
};

struct ParamSpec {
  int64_t numel;
  DType dtype;
};

struct BucketSpec {
  DType dtype;
  std::vector<size_t> params;    // indices into the parameter list, in the order they are laid out in the buffer
  std::vector<int64_t> offsets;  // element offset of each parameter in the bucket's flat buffer
  int64_t numel = 0;             // total elements
};

// Buckets in the order they are expected to become ready. Each parameter is in exactly one bucket.
std::vector<BucketSpec> assign_buckets(const std::vector<ParamSpec>& params, const BucketCaps& caps = {});

}  // namespace minidl::dist
