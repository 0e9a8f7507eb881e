// How much of data parallelism's gradient communication a step waits for: the buckets' collectives run one after
// another on one communication stream (dist/reducer.h's thread, NCCL's stream), each starting when its bucket's last
// gradient is ready and the previous collective is done, while backward goes on. What ends after backward ends is
// exposed.
//
//   bucket i: ready r_i, cost c_i;  start_i = max(r_i, end_{i−1});  end_i = start_i + c_i
//   exposed = max(0, end_last − backward_end)
//
// Two buckets, the first ready at 2 costing 3, the second ready at backward's end 4 costing 1: the first runs 2-5,
// the second 5-6, and 2 of the 4 units of communication are exposed.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/bucketing.h"

namespace minidl::predict {

struct BucketTiming {
  double ready = 0;  // when its last gradient is ready, from the start of backward
  double cost = 0;   // its collective's time
};

struct OverlapResult {
  double comm_total = 0;  // Σ c_i
  double comm_end = 0;    // when the last collective ends
  double exposed = 0;     // max(0, comm_end − backward_end)
};

OverlapResult overlap_buckets(const std::vector<BucketTiming>& buckets, double backward_end);

// A unit of parameters whose gradients become ready together (a block, the embedding, the head's ln_f), in the
// model's registration order, with the time backward finishes it.
struct GradUnit {
  int64_t numel = 0;
  double ready = 0;
};

// The buckets dist::assign_buckets makes of these units (f32 gradients, reverse registration order, 1 MiB first
// bucket, 25 MiB after; a unit is the granularity: its parameters share one ready time), each ready when its last
// unit is, and its size in elements.
struct Bucket {
  int64_t numel = 0;
  double ready = 0;
};
std::vector<Bucket> gradient_buckets(const std::vector<GradUnit>& units, const dist::BucketCaps& caps = {});

}  // namespace minidl::predict
