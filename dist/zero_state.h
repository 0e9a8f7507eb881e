// ZeRO checkpoints: per-shard optimizer state <-> one tensor per logical parameter.
//
// Under ZeRO 1-3 (dist/zero.h, dist/zero3.h) the optimizer steps on *shard parameters*: pieces of the padded flat
// bucket buffers, cut at parameter boundaries, rank r holding elements [r·P/N, (r+1)·P/N) of each bucket of P
// elements. A checkpoint stores AdamW's m and v per logical parameter instead (the names and shapes of a --zero 0
// checkpoint), so that any ZeRO stage at any dp size can load it:
//
//   // save, collective over the group: every rank sends its shard and keeps the whole tensors it writes
//   std::vector<Tensor> m = dist::gather_logical(zero.reducer(), zero.shard_pieces(), m_of_each_shard_param, mine);
//   // load, local: this rank's pieces sliced out of the whole tensors (padding belongs to no piece: it stays zero)
//   std::vector<Tensor> mine = dist::slice_logical(zero.reducer(), zero.shard_pieces(), m_by_reducer_param);
//
// The gather is one all-gather of P elements per bucket (padding included, then dropped): a rank holds one bucket
// at a time beside the tensors it keeps (in a checkpoint, those it writes: about 1/N of them). An all-gather rather
// than a gather to one rank because the process group has no gather; the bytes on the wire are those of one parameter
// all-gather, once per save.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/reducer.h"

namespace minidl::dist {

// Where a shard parameter lies: elements [begin, begin + numel) of bucket `bucket`'s padded flat buffer, inside
// parameter buckets()[bucket].params[slot].
struct ShardPiece {
  size_t bucket = 0;
  size_t slot = 0;
  int64_t begin = 0;
  int64_t numel = 0;
};

// Collective over reducer.group(). values[i]: piece i's state (numel elements, any shape, on any device). Returns
// one tensor per reducer.params() (same order and shape, contiguous, on the group's device) for those with
// keep[i] true, undefined tensors for the others (keep: one flag per reducer.params()).
std::vector<Tensor> gather_logical(Reducer& reducer, const std::vector<ShardPiece>& pieces,
                                   const std::vector<Tensor>& values, const std::vector<bool>& keep);

// Local. logical: one tensor per reducer.params() (their shapes). Returns piece i's elements for each piece, 1-D.
std::vector<Tensor> slice_logical(const Reducer& reducer, const std::vector<ShardPiece>& pieces,
                                  const std::vector<Tensor>& logical);

}  // namespace minidl::dist
