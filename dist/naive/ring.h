// Naive ring all-reduce: a reduce-scatter then an all-gather, written over nothing but send and recv. Read this
// first of all: every other file here calls all_reduce, and this is what it does. Production: dist/ring_backend.cpp
// (the same schedule, pipelined in slices, on the CPU or a CUDA device).
//
//   Tensor g = ...;                                              // contiguous f32, the same numel on every rank
//   dist::naive::ring_all_reduce(group, g, dist::ReduceOp::kAvg);  // g = the mean over the ranks of g
//
// The ring. N ranks, rank r sends only to its right neighbour r+1 and receives only from its left neighbour r-1
// (mod N). Cut the buffer into N chunks, chunk c = shard_range(numel, N, c) (sizes differing by at most one
// element; with numel < N some chunks are empty, and a send or recv of nothing is a no-op on both ends).
//
// Reduce-scatter, N-1 steps. At step s rank r sends chunk (r-s-1) to the right and receives chunk (r-s-2) from
// the left, adding it into its own copy. What rank r sends at step s+1 is chunk (r-s-2): the chunk it has just
// added into. So a chunk walks around the ring picking up one rank's term per hop: chunk c starts on rank c+1
// (step 0: it sends its chunk c), and after N-1 hops reaches rank c holding all N terms. Hence after the last
// step (s = N-2, chunk r-N = r) rank r holds the complete chunk r, as a reduce-scatter promises. With N = 3:
//            rank 0          rank 1          rank 2
//   step 0   sends c0 -> 1   sends a1 -> 2   sends b2 -> 0
//            b0+b2           c1+c0           a2+a1
//   step 1   sends b0+b2     sends c1+c0     sends a2+a1
//            a0+a2+a1        b1+b0+b2        c2+c1+c0         rank r's chunk r is complete
// The order of the terms is fixed (chunk c adds ranks c+1, c+2, ..., c), so every run gives the same bits.
//
// All-gather, N-1 steps. At step t rank r sends chunk (r-t) (at t = 0 the chunk it completed) and receives chunk
// (r-t-1), overwriting its copy; again it forwards at t+1 what it received at t, so after N-1 hops every finished
// chunk has reached every rank.
//
// Why it cannot deadlock: a send is posted (asynchronous), then the step's recv is waited for, then the send. Every
// rank receives at step s what its left neighbour sends at step s, so no rank waits for a message that is sent
// later. Tags: the step number, so a message can only meet the recv of its own step.
//
// Cost, per rank: 2(N-1) messages of numel/N elements, 2(N-1)/N·numel elements sent and as many received,
// whatever N: bandwidth-optimal (to own the sum of its 1/N a rank must receive the others' (N-1)/N of terms, then
// the (N-1)/N of results it did not compute). kAvg divides the sum by N once, on the rank's own chunk, between the
// two phases: the all-gather then spreads the averages.
//
// What production adds: slices (a chunk streamed in pieces, each forwarded as soon as it is added), every dtype,
// device buffers and streams, kMax, the flight recorder's record of each message. It computes the same bits.
#pragma once

#include <cstdint>
#include <memory>

#include "dist/process_group.h"
#include "dist/shard.h"

namespace minidl::dist::naive {

// Chunk c of the buffer seen flat: elements shard_range(numel, N, c).
inline Tensor ring_chunk(const Tensor& buffer, int n, int c) {
  const ShardRange range = shard_range(buffer.numel(), n, ((c % n) + n) % n);
  return buffer.detach().reshape({buffer.numel()}).narrow(0, range.begin, range.size());
}

// Sends `out` to the right neighbour and receives `in` from the left one, both tagged `step`.
inline void ring_exchange(ProcessGroup& group, const Tensor& out, Tensor& in, int step) {
  const int n = group.size(), r = group.rank();
  std::shared_ptr<Work> sent = group.send(out, (r + 1) % n, step);
  group.recv(in, (r + n - 1) % n, step)->wait();
  sent->wait();
}

// Collective. Afterwards chunk group.rank() of `buffer` holds the sum over the ranks of that chunk (the other
// chunks hold partial sums). buffer: contiguous f32 on the CPU, the same numel on every rank.
inline void ring_reduce_scatter(ProcessGroup& group, Tensor& buffer) {
  // EXERCISE(ring): N-1 steps; at step s send chunk r-s-1 to the right, receive chunk r-s-2 from the left into
  // a scratch tensor, and add it into your copy of that chunk.
  const int n = group.size(), r = group.rank();
  for (int s = 0; s < n - 1; ++s) {
    Tensor mine = ring_chunk(buffer, n, r - s - 2);
    Tensor incoming = Tensor::empty({mine.numel()});
    ring_exchange(group, ring_chunk(buffer, n, r - s - 1), incoming, s);
    float* dst = mine.data<float>();
    const float* src = incoming.data<float>();
    for (int64_t i = 0; i < mine.numel(); ++i) dst[i] += src[i];
  }
  // END EXERCISE
}

// Collective. Afterwards every chunk c of `buffer` holds what rank c's chunk c held before.
inline void ring_all_gather(ProcessGroup& group, Tensor& buffer) {
  // EXERCISE(ring): N-1 steps; at step t send chunk r-t to the right and receive chunk r-t-1 from the left
  // straight into your copy. Tag the steps apart from the reduce-scatter's.
  const int n = group.size(), r = group.rank();
  for (int t = 0; t < n - 1; ++t) {
    Tensor into = ring_chunk(buffer, n, r - t - 1);
    ring_exchange(group, ring_chunk(buffer, n, r - t), into, n - 1 + t);
  }
  // END EXERCISE
}

// Collective: buffer = op over the ranks of buffer, in place. op: kSum or kAvg.
inline void ring_all_reduce(ProcessGroup& group, Tensor& buffer, ReduceOp op) {
  MINIDL_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, "naive ring: expected kSum or kAvg, got ",
               reduce_op_name(op));
  MINIDL_CHECK(buffer.dtype() == DType::f32 && buffer.is_contiguous() && buffer.device().is_cpu(),
               "naive ring: expected a contiguous f32 CPU tensor, got ", buffer.dtype(), " on ", buffer.device());
  // EXERCISE(ring): reduce-scatter; for kAvg divide your own chunk by N; all-gather.
  ring_reduce_scatter(group, buffer);
  if (op == ReduceOp::kAvg) {
    Tensor mine = ring_chunk(buffer, group.size(), group.rank());
    float* p = mine.data<float>();
    for (int64_t i = 0; i < mine.numel(); ++i) p[i] /= float(group.size());
  }
  ring_all_gather(group, buffer);
  // END EXERCISE
}

}  // namespace minidl::dist::naive
