// The model one rank trains and the gradient synchronisation around it, for every dp × tp × pp × ZeRO
// combination: which model (nn::GPT, dist::TensorParallelGPT, or a PipelineModel of either) and which GradSync
// strategies, composed as decorators. The Trainer's constructor calls it; it is the one place that knows the
// matrix.
//
//   train::ParallelModel m = train::build_model_and_sync(cfg, model_cfg, topology, device, first_sample, {});
//   optim::AdamW opt(m.sync->optimizer_groups(optim::decay_groups(m.named_parameters(), 0.1)), {.lr = 1e-3});
//
// The composition (read from the inside out):
//   pp > 1:                      PipelineSync (its dp group: all-reduce, or ZeRO 1-2 after the last backward)
//   pp = 1, --zero 3:            Zero3Sync              (dp group)
//   pp = 1, --zero 1 or 2:       ZeroSync               (dp group)
//   pp = 1, dp > 1:              DDPSync                (dp group)
//   pp = 1, dp = 1, tp > 1:      ModelParallelSync      (nothing to synchronise; norm over the tp group)
//   otherwise:                   GradSync               (one process)
//   then, with tp > 1, around any of them: TensorParallelSync (replicated parameters counted once in the norm,
//   their partial gradients summed over tp under --sequence-parallel).
// Each strategy counts its own duplicates once in the gradient norm (the pipeline's second wte, ZeRO's shards over
// dp, tp's replicated parameters), so the clipped step equals one process's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "dist/topology.h"
#include "nn/gpt.h"
#include "train/grad_sync.h"
#include "train/pipeline_step.h"
#include "train/trainer.h"

namespace minidl::train {

struct ParallelModel {
  std::unique_ptr<nn::GPT> model;       // pp = 1: the whole model (tp > 1: this rank's split of it)
  std::unique_ptr<PipelineModel> pipe;  // pp > 1: this stage's chunks
  std::unique_ptr<GradSync> sync;
  int64_t num_params = 0;               // the whole model's (collective to count with pp > 1)
  std::vector<std::string> notes;       // lines for the run's header

  // The parameters of whichever model this is, with whole-model names.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
};

// Collective over the topology's groups. Builds the model of `config` (validated) on `device`, in training mode,
// with its dropout position and recomputation set, and its GradSync. `load` (may be empty) is called with a pp = 1
// model, `load_stage` (may be empty) with a pp > 1 stage, after it is built and before it moves to the device or
// ZeRO shards it: where checkpoint weights go in.
ParallelModel build_model_and_sync(const TrainConfig& config, const nn::GPTConfig& model_config,
                                   const dist::Topology& topology, Device device, int64_t first_sample,
                                   const std::function<void(nn::GPT&)>& load,
                                   const std::function<void(PipelineModel&)>& load_stage = {});

}  // namespace minidl::train
