// How the Trainer turns TrainConfig's pipeline flags (--pp, --micro-batches, --schedule, --virtual-stages,
// --pp-layers) into a schedule and a block split. Internal to train/ (trainer.cpp and trainer_pipeline.cpp).
#pragma once

#include <string>
#include <vector>

#include "dist/pipeline.h"
#include "nn/gpt.h"
#include "train/trainer.h"

namespace minidl::train {

// The schedule of the configuration (validated).
dist::PipelineSpec pipeline_spec(const TrainConfig& c);
// Global chunk c holds blocks [starts[c], starts[c + 1]): --pp-layers, or the split by parameter count.
std::vector<int64_t> pipeline_starts(const TrainConfig& c, const nn::GPTConfig& model);
// Throws naming the flag for what a pipeline cannot run (called by TrainConfig::validate; d = the dp size).
void validate_pipeline(const TrainConfig& c, int d);
// One line for the header: schedule, micro-batches, the blocks of every stage, the simulated bubble.
std::string pipeline_note(const TrainConfig& c, const std::vector<int64_t>& starts);

}  // namespace minidl::train
