// Checkpoints of a pipeline-parallel run (train/pipeline_step.h): every file holds the whole model's tensors, as one
// process would write them, so a checkpoint or a --save from any --pp loads at any other --pp (or none), in PyTorch
// and with --init-from; with any --tp inside the stages and any --zero 1|2 over their dp groups.
//
// A stage holds a subset of the logical tensors (its chunks' blocks; wte and wpe on the first stage, ln_f on the
// last; the tied wte also on the last stage, identical to the first stage's copy); with tp > 1 each rank of the
// stage's tp group holds slices of them (every chunk a dist::TensorParallelGPT). Saving gathers each chunk's slices
// over the tp group into whole tensors (TensorParallelGPT::gather_whole), then tp rank 0 of every stage sends its
// chunks' tensors to pp rank 0, chunk by chunk in global order (so the concatenation is nn::GPT's
// named_parameters() order), wte once. AdamW's moments need no pipeline gather: each stage's dp × tp ranks write
// a share of the stage's own logical tensors (pipeline_optimizer_state), the files together holding every logical
// tensor once; under ZeRO the stage's shards are first all-gathered over its dp group (dist/zero_state.h), and at
// tp > 1 the slices over its tp group. Loading is the reverse: every chunk takes its tensors out of the whole
// files (both copies of wte included), each tp rank its slices, each ZeRO rank its shard.
//
//   std::shared_ptr<const nn::GPT> whole = train::consolidated_pipeline_model(pipe, logger);  // collective
//   if (logger) nn::save_gpt(path, *whole, vocab_json);
//   train::load_pipeline_model(pipe, path);                                                   // local
#pragma once

#include <memory>
#include <string>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/pipeline_step.h"

namespace minidl::train {

// Collective over the pp and tp groups of this dp replica (the other replicas hold the same values and return at
// once): `local` (one tensor per pipe.named_parameters(), in that order, shaped like the parameter: a tp slice at
// tp > 1) as the whole model's tensors in nn::GPT's named_parameters() order (wte once, whole), on the CPU, where
// `keep` (the rank at grid coordinate (0, 0, 0) only; elsewhere an empty list).
nn::NamedTensors gather_pipeline(const PipelineModel& pipe, const nn::NamedTensors& local, bool keep);

// The whole model as a one-process GPT on the CPU where `keep` (null elsewhere). Collective as gather_pipeline.
std::shared_ptr<nn::GPT> consolidated_pipeline_model(const PipelineModel& pipe, bool keep);

// The logical tensors this stage owns (its chunks' parameters, wte only on the first stage), in order, with their
// one-process element counts (whole shapes at tp > 1): what its dp × tp ranks share out when they write a
// checkpoint (train/checkpoint.h's checkpoint_share).
std::vector<std::pair<std::string, int64_t>> pipeline_logical_sizes(const PipelineModel& pipe);
// This rank's share of them: share dp·tp_size + tp of the stage's dp·tp_size writers.
KeepTensors pipeline_checkpoint_share(const PipelineModel& pipe);
// AdamW's m and v of the logical tensors of this stage that `keep` names, whole. `sync` is the run's GradSync (a
// PipelineSync, or a TensorParallelSync around one). Collective over the stage's dp group under ZeRO and over its
// tp group at tp > 1 (every rank calls it, whatever it keeps); local otherwise.
OptimizerCheckpoint pipeline_optimizer_state(const optim::AdamW& optimizer, const PipelineModel& pipe, GradSync& sync,
                                             const KeepTensors& keep);

// Every chunk's parameters from the whole model's tensors (by name; both copies of wte; at tp > 1 this rank's
// slices). Local. Throws naming a missing or misshapen tensor; the second form names the file too.
void load_pipeline_model(PipelineModel& pipe, const nn::StateDict& whole);
void load_pipeline_model(PipelineModel& pipe, const std::string& path);
// The checkpoint's weights (after checking its model config), and AdamW's m, v and step of this stage's parameters
// (this rank's slices at tp > 1, its shard under ZeRO). Local.
void restore_pipeline_model(const Checkpoint& c, PipelineModel& pipe);
void restore_pipeline_optimizer(const Checkpoint& c, const PipelineModel& pipe, GradSync& sync,
                                optim::AdamW& optimizer);

}  // namespace minidl::train
