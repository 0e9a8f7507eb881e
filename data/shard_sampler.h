// ShardSampler: training windows streamed from token shards (data/token_shards.h) that are never all in memory:
// only the shard the current step reads is loaded. Like BatchSampler, the global batch of a step depends only on
// (seed, step) — not on the ranks sharing it, nor on what was sampled before — so a run resumed at step s draws
// exactly what the uninterrupted run drew, with the step (in every training checkpoint) as the loader's position.
//
// The schedule. Shard f of the training files holds W_f windows of seq + 1 tokens at offsets 0, seq, 2 seq, ...
// (consecutive windows share one token, as llm.c's loader reads them) and serves S_f = floor(W_f / B) steps of B
// windows (B: the global batch). An epoch visits every shard once, in an order drawn from (seed, epoch), and a
// shard's windows in an order drawn from (seed, epoch, shard): step s falls in epoch s / sum(S_f), in the shard the
// epoch's order puts there, and takes windows [j B, (j + 1) B) of that shard's permutation, j being the step's
// place in the shard. A shard with fewer than B windows is an error naming it.
//
//   data::ShardSampler sampler(ds.train_shards(), /*seq=*/1024, /*global_batch=*/64, /*seed=*/1337);
//   data::Batch b = sampler.batch(step, begin, n);   // this rank's rows of the global batch, i32
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sampler.h"

namespace minidl::data {

class ShardSampler {
 public:
  // files: the training shards, in a fixed order (their names'); each holds at least seq * global_batch + 1 tokens.
  // vocab > 0: every token of a shard must be below it, checked as the shard loads (the error names the file).
  ShardSampler(std::vector<std::string> files, int64_t seq, int64_t global_batch, uint64_t seed, int64_t vocab = 0);
  // Rows [begin, begin + n) of step `step`'s global batch (as BatchSampler::batch): loads that step's shard if it
  // is not the one in memory.
  Batch batch(int64_t step, int64_t begin, int64_t n);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The shard file step `step` reads (for tests and logs).
  const std::string& shard_of(int64_t step) const;

 private:
  struct Place {
    int64_t epoch, shard, step_in_shard;
  };
  Place place(int64_t step) const;
  std::vector<int64_t> shard_order(int64_t epoch) const;  // a permutation of the files' indices

  std::vector<std::string> files_;
  std::vector<int64_t> steps_of_;  // S_f
  int64_t seq_, global_batch_, vocab_, steps_per_epoch_ = 0;
  uint64_t seed_;
  // The shard in memory: (epoch, shard) it was loaded for, its tokens and its windows' permutation.
  int64_t loaded_epoch_ = -1, loaded_shard_ = -1;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> windows_;
};

}  // namespace minidl::data
