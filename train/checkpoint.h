// Training checkpoints that resume bit for bit: a directory holding everything a run's future depends on.
//
//   ckpt/step-00000020/
//     model.safetensors      the model, Hugging Face GPT-2 names (what --init-from and PyTorch load), + config.json
//     optimizer.safetensors  AdamW's m and v per logical parameter ("exp_avg.<name>", "exp_avg_sq.<name>"), so a
//                            run with another data-parallel size, ZeRO stage, tp or pp can reload it; at N ranks
//                            optimizer-00000-of-0000N.safetensors ...: each rank writes its share of the logical
//                            tensors (checkpoint_share; under ZeRO and tp gathered from the shards, padding
//                            dropped), and each rank of the resumed run slices its own part out again
//                            (GradSync::logical_state / load_logical_state)
//     state.json             the optimizer step, the LR-schedule step, the training step (which is also the data
//                            sampler's and the dropout masks' position: both are pure functions of (seed, step)),
//                            the loss scaler, the model config and the run's configuration
//     manifest.json          every file above with its size and FNV-1a 64 checksum
//     DONE                   written last: a directory without it is incomplete and never resumed from
//
// The directory is written as step-XXXXXXXX.tmp and renamed into place only when complete (every rank's file, a
// barrier, then the leader's manifest and DONE), so a crash mid-save leaves the previous checkpoint intact. Loading verifies every size and checksum and
// names the file and what is wrong (truncated, corrupted, missing), before anything is overwritten.
//
//   train::save_checkpoint(dir / "step-00000020", model, vocab_json, optimizer, state);
//   // at N ranks (collective: every rank calls both; the weights whole on the leader: consolidated_model):
//   train::OptimizerCheckpoint opt = train::logical_optimizer_state(optimizer, sync, model,
//                                       train::checkpoint_share(train::logical_sizes(model), rank, N));
//   train::save_checkpoint(dir / "step-00000020", leader ? &whole : nullptr, vocab_json, opt, state,
//                          {rank, N, leader, barrier});
//   train::Checkpoint c = train::load_checkpoint(dir / "step-00000020");   // verified
//   train::restore_model(c, model);                   // before the GradSync shards the parameters
//   train::restore_optimizer(c, model, optimizer, sync);
//   std::optional<std::string> latest = train::latest_checkpoint(dir, log); // newest complete one
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "train/grad_sync.h"

namespace minidl::train {

struct TrainingState {
  int64_t step = 0;           // optimizer steps taken (training steps completed, skipped ones included)
  int64_t schedule_step = 0;  // the LR schedule's position (holds still on skipped fp16 steps)
  std::optional<optim::GradScalerState> scaler;
  std::string config;         // the run's configuration as JSON (what a resumed run is checked against)
};

struct Checkpoint {
  std::string dir;
  nn::GPTConfig model_config;
  std::string vocab_json;
  TrainingState state;
  int64_t optimizer_step = 0;
  std::map<std::string, Tensor> exp_avg, exp_avg_sq;  // by parameter name
};

// AdamW's state per logical parameter (names and shapes of the model's parameters, whatever the sharding).
struct OptimizerCheckpoint {
  int64_t step = 0;
  nn::NamedTensors exp_avg, exp_avg_sq;
};

// The optimizer's state per logical parameter, of the tensors `keep` names. Collective over the dp group under ZeRO
// and over the tp group at tp > 1 (every rank calls it, whatever it keeps).
OptimizerCheckpoint logical_optimizer_state(const optim::AdamW& optimizer, GradSync& sync, const nn::Module& model,
                                            const KeepTensors& keep);

// Who writes what. Every rank writes one optimizer file holding its share of the logical tensors (`index` of
// `count` files: "optimizer.safetensors" when count is 1, else "optimizer-00001-of-00004.safetensors"); the leader
// also writes the model, state.json, and, after every file is written, manifest.json and DONE, then renames the
// directory into place. `barrier` synchronises every rank taking part (a no-op for one process).
struct CheckpointWriter {
  int index = 0, count = 1;
  bool leader = true;
  std::function<void()> barrier = [] {};
};
// The optimizer file of writer `index` of `count`.
std::string optimizer_file_name(int index, int count);
// The logical tensors (name, element count, in a fixed order) split into `writers` contiguous runs of about equal
// size, tensor i going to the writer whose share holds its first element: which of them writer `writer` keeps.
// Pure, so every rank (and every parallel layout of the same tensors) agrees.
KeepTensors checkpoint_share(const std::vector<std::pair<std::string, int64_t>>& logical, int writer, int writers);
// The model's logical tensors in named_parameters() order with their one-process element counts (a
// TensorParallelGPT's whole shapes).
std::vector<std::pair<std::string, int64_t>> logical_sizes(const nn::Module& model);

// Name of the checkpoint directory for a step: "step-00000020".
std::string checkpoint_name(int64_t step);

// Writes the checkpoint directory `dir` (which must not exist yet) atomically, as described above.
void save_checkpoint(const std::string& dir, const nn::GPT& model, const std::string& vocab_json,
                     const optim::AdamW& optimizer, const TrainingState& state);
// Collective over the writers: this rank's part of the checkpoint (`model`, whole, is read on the leader only and
// may be null elsewhere; `optimizer` holds this rank's share of the logical tensors).
void save_checkpoint(const std::string& dir, const nn::GPT* model, const std::string& vocab_json,
                     const OptimizerCheckpoint& optimizer, const TrainingState& state, const CheckpointWriter& writer);

// The model as one process holds it, for save_checkpoint: `model` itself, or for a dist::TensorParallelGPT its
// parameters gathered over the tp group (collective there: every rank of the group calls it) into a one-process
// GPT. Null where `keep` is false.
std::shared_ptr<const nn::GPT> consolidated_model(const nn::GPT& model, bool keep);

// Reads and verifies a checkpoint directory; throws naming the file and the problem.
Checkpoint load_checkpoint(const std::string& dir);

// Puts the checkpoint's weights and optimizer state into `model` and `optimizer` (built for the same config);
// throws naming what does not match. One process, or DDP.
void restore_checkpoint(const Checkpoint& c, nn::GPT& model, optim::AdamW& optimizer);
// The two halves, for any GradSync. restore_model: the weights (before a ZeRO GradSync shards them).
// restore_optimizer: AdamW's m, v and step; each rank takes its owned pieces (ZeRO: its shard) of the logical
// tensors, local. A dist::TensorParallelGPT takes its slices of the whole tensors (any tp, padding zero).
void restore_model(const Checkpoint& c, nn::GPT& model);
void restore_optimizer(const Checkpoint& c, const nn::Module& model, optim::AdamW& optimizer, GradSync& sync);

// The newest complete checkpoint (step-* with DONE) in `parent`, or none. Incomplete ones are reported through
// `log` and skipped.
std::optional<std::string> latest_checkpoint(const std::string& parent, const std::function<void(const std::string&)>& log);

// Deletes all but the newest `keep` complete checkpoints in `parent` (and any *.tmp left by a crash).
void prune_checkpoints(const std::string& parent, int64_t keep);

// SIGTERM or SIGUSR1 received since install_preemption_handlers() (async-signal-safe flag).
void install_preemption_handlers();
bool preemption_requested();

}  // namespace minidl::train
