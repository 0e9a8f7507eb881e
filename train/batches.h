// train::Batches: where each step's batch comes from, and the step run on it. The split in memory, token shards
// streamed one at a time, or (on a CUDA device) the split uploaded once and each batch drawn there, by the step
// itself when it is a captured CUDA graph (--cuda-graph).
//
//   train::Batches batches(ds, stage, config, seq, first_sample, local_batch);
//   train::StepResult r = batches.step(stage, optimizer, step, options);   // data, then train::train_step
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "data/sampler.h"
#include "data/shard_sampler.h"
#include "data/text_dataset.h"
#include "optim/adamw.h"
#include "train/config.h"
#include "train/cuda_graph.h"
#include "train/stage.h"
#include "train/step.h"

namespace minidl::train {

class Batches {
 public:
  // This rank's samples [first, first + n) of every global batch of config.batch windows of seq + 1 tokens.
  Batches(const data::TextDataset& ds, const Stage& stage, const TrainConfig& config, int64_t seq, int64_t first,
          int64_t n);
  // One step of `stage` on this rank's slice of step `step`'s global batch.
  StepResult step(Stage& stage, optim::Optimizer& optimizer, int64_t step, StepOptions options);
  // --cuda-graph (one process on a device: TrainConfig::validate): the step captured once and replayed.
  void capture(Stage& stage, optim::AdamW& optimizer, StepOptions options);
  double data_ms = 0;  // the last step's time drawing its batch

 private:
  int64_t first_, n_;
  std::optional<data::BatchSampler> in_memory_;
  std::optional<data::ShardSampler> streamed_;
  std::optional<data::DeviceBatchSampler> on_device_;  // declared before the graph, whose kernels read its buffers
  std::unique_ptr<CudaGraphStep> graph_;
};

}  // namespace minidl::train
