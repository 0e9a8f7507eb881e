// How a flat buffer is cut among the ranks of a group: the one shard_range every sharded piece of minidl uses
// (the ring's chunks, the reducer's padded buckets, ZeRO's optimizer/gradient/parameter shards).
//
//   dist::ShardRange r = dist::shard_range(/*numel=*/10, /*parts=*/4, /*index=*/1);   // [3, 6)
//   int64_t padded = dist::padded_numel(10, 4);                                        // 12: 4 shards of 3
//
// Uneven sizes: the first numel % parts shards get one extra element, so sizes differ by at most one and every rank
// computes the same boundaries (senders and receivers agree on message sizes without talking). A buffer that must
// reduce-scatter evenly (the reducer's buckets) is padded to padded_numel() instead, so that every shard has
// exactly padded / parts elements.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace minidl::dist {

struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Elements [begin, end) of shard `index` when `numel` elements are cut into `parts` contiguous shards whose sizes
// differ by at most one. Shards are empty when numel < parts.
inline ShardRange shard_range(int64_t numel, int parts, int index) {
  MINIDL_ASSERT(parts > 0 && index >= 0 && index < parts && numel >= 0, "shard_range(", numel, ", ", parts, ", ", index,
                ")");
  const int64_t base = numel / parts, extra = numel % parts;
  const int64_t begin = index * base + (index < extra ? index : extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

// numel rounded up to a multiple of parts (at least parts when numel > 0, 0 for 0): the size of a buffer whose
// shards are all numel / parts long.
inline int64_t padded_numel(int64_t numel, int parts) {
  MINIDL_ASSERT(parts > 0 && numel >= 0, "padded_numel(", numel, ", ", parts, ")");
  return (numel + parts - 1) / parts * parts;
}

}  // namespace minidl::dist
