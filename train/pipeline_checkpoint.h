// Checkpoints of a pipeline-parallel run (train/pipeline_step.h): every file holds the whole model's tensors, as one
// process would write them, so a checkpoint or a --save from any --pp loads at any other --pp (or none), in PyTorch
// and with --init-from.
//
// A stage holds a subset of the logical tensors (its chunks' blocks; wte and wpe on the first stage, ln_f on the
// last; the tied wte also on the last stage, identical to the first stage's copy). Saving sends each chunk's tensors
// to pp rank 0, chunk by chunk in global order (so the concatenation is nn::GPT's named_parameters() order), wte
// once; AdamW's moments need no gather: each stage's ranks write the stage's own (pipeline_optimizer_state), the
// files together holding every logical tensor once. Loading lets every chunk take its tensors out of the whole
// files, both copies of wte included.
//
//   std::shared_ptr<const nn::GPT> whole = train::consolidated_pipeline_model(pipe, logger);  // collective (pp)
//   if (logger) nn::save_gpt(path, *whole, vocab_json);
//   train::load_pipeline_model(pipe, nn::load_safetensors(path).tensors);                    // local
#pragma once

#include <memory>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/pipeline_step.h"

namespace minidl::train {

// Collective over the pp group of this dp replica (the other replicas hold the same values and return at once):
// `local` (one tensor per pipe.named_parameters(), in that order, shaped like the parameter) as the whole model's
// tensors in nn::GPT's named_parameters() order (wte once), on the CPU, where `keep` (pp rank 0 of dp replica 0
// only; elsewhere an empty list).
nn::NamedTensors gather_pipeline(const PipelineModel& pipe, const nn::NamedTensors& local, bool keep);

// The whole model as a one-process GPT on the CPU where `keep` (null elsewhere). Collective as gather_pipeline.
std::shared_ptr<nn::GPT> consolidated_pipeline_model(const PipelineModel& pipe, bool keep);

// The logical tensors this stage owns (its chunks' parameters, wte only on the first stage), in order, with their
// element counts: what its dp ranks share out when they write a checkpoint (train/checkpoint.h's checkpoint_share).
std::vector<std::pair<std::string, int64_t>> pipeline_logical_sizes(const PipelineModel& pipe);
// AdamW's m and v of the logical tensors of this stage that `keep` names. Local: a stage writes its own.
OptimizerCheckpoint pipeline_optimizer_state(const optim::AdamW& optimizer, const PipelineModel& pipe,
                                            const KeepTensors& keep);

// Every chunk's parameters from the whole model's tensors (by name; both copies of wte). Local. Throws naming a
// missing or misshapen tensor.
void load_pipeline_model(PipelineModel& pipe, const nn::StateDict& whole);
// The checkpoint's weights (after checking its model config) and AdamW's m, v and step of this stage's parameters.
void restore_pipeline_model(const Checkpoint& c, PipelineModel& pipe);
void restore_pipeline_optimizer(const Checkpoint& c, const PipelineModel& pipe, optim::AdamW& optimizer);

}  // namespace minidl::train
