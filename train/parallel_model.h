// The part of the model one rank trains and the gradient synchronisation around it, for every dp × tp × pp × ZeRO
// combination: one train::Stage (pp = 1: one chunk holding the whole model; pp > 1: this stage's chunks; tp > 1:
// every chunk split over the tp group) and one train::GradSync over its chunks. The Trainer's constructor calls it.
//
//   train::ParallelModel m = train::build_model_and_sync(cfg, model_cfg, topology, device, first_sample, {});
//   optim::AdamW opt(m.sync->optimizer_groups(optim::decay_groups(m.stage->named_parameters(), 0.1)), {.lr = 1e-3});
//   train::train_step(*m.stage, opt, batch, o);   // o.grad_sync = m.sync.get()
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "dist/topology.h"
#include "train/grad_sync.h"
#include "train/stage.h"
#include "train/trainer.h"

namespace minidl::train {

struct ParallelModel {
  std::unique_ptr<Stage> stage;
  std::unique_ptr<GradSync> sync;
  int64_t num_params = 0;          // the whole model's (collective to count with pp > 1)
  std::vector<std::string> notes;  // lines for the run's header
};

// Collective over the topology's groups. Builds this rank's stage of the model of `config` (validated) on `device`,
// in training mode, with its dropout position and recomputation set, and its GradSync. `load` (may be empty) is
// called with the stage after it is built and before it moves to the device or ZeRO shards it: where checkpoint
// weights go in.
ParallelModel build_model_and_sync(const TrainConfig& config, const nn::GPTConfig& model_config,
                                   const dist::Topology& topology, Device device, int64_t first_sample,
                                   const std::function<void(Stage&)>& load);

// The schedule of the configuration (validated): --pp stages, --micro-batches (alias --grad-accum; default --pp),
// --schedule, --virtual-stages.
dist::PipelineSpec pipeline_spec(const TrainConfig& c);
// Global chunk c holds blocks [starts[c], starts[c + 1]): --pp-layers, or the split by parameter count.
std::vector<int64_t> pipeline_starts(const TrainConfig& c, const nn::GPTConfig& model);
// Throws naming the flag for what the schedule cannot run (called by TrainConfig::validate; d = the dp size).
void validate_pipeline(const TrainConfig& c, int d);
// One line for the header (pp > 1): schedule, micro-batches, the blocks of every stage, the simulated bubble.
std::string pipeline_note(const TrainConfig& c, const std::vector<int64_t>& starts);

}  // namespace minidl::train
