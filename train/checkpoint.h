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
// barrier, then the leader's manifest and DONE), so a crash mid-save leaves the previous checkpoint intact. Loading
// verifies every size and checksum and names the file and what is wrong (truncated, corrupted, missing), before
// anything is overwritten.
//
// Every layout writes the same files: the model as one process holds it (gathered over tp, and from every pipeline
// stage to pp rank 0), and AdamW's moments of the logical tensors, each rank writing a share of its stage's own
// (gathered from ZeRO's shards over dp and from the tp slices first), so a checkpoint from any dp, tp, pp or ZeRO
// loads into any other (or into PyTorch, for the model).
//
//   // collective: every rank calls these
//   train::OptimizerCheckpoint opt = train::optimizer_state(optimizer, stage, sync, train::checkpoint_share(stage));
//   auto whole = train::consolidated_model(stage, leader);             // the one-process GPT on the leader
//   train::save_checkpoint(dir / "step-00000020", whole.get(), vocab_json, opt, state, {index, N, leader, barrier});
//   train::Checkpoint c = train::load_checkpoint(dir / "step-00000020");   // verified
//   train::restore_model(c, stage);                    // before the GradSync shards the parameters
//   train::restore_optimizer(c, stage, sync, optimizer);
//   std::optional<train::Checkpoint> latest = train::latest_checkpoint(dir, log);   // newest that verifies
//
// A run of R > 1 replicas (--sync local-sgd | diloco, dist/local_sgd.h) holds R different models between two outer
// syncs, each with its own AdamW state, so its checkpoint holds R checkpoints and DiLoCo's state beside them:
//
//   ckpt/step-00000020/
//     replica-00000/ ... replica-00001/   each a checkpoint as above, written by its replica's ranks
//     outer-00000-of-00002.safetensors    DiLoCo's θ_global and outer momentum ("global", "momentum"), flat over the
//                                         parameters rank i of a replica holds (replica 0's ranks write them: every
//                                         replica holds the same); none for local SGD, which keeps no state
//     manifest.json, DONE                 the replicas' manifest.json and the outer files, checksummed; DONE last
//
// so a run resumes bitwise in the middle of an H-step window as at its boundary (same layout inside a replica).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "train/grad_sync.h"
#include "train/stage.h"

namespace minidl::train {

struct TrainingState {
  int64_t step = 0;           // optimizer steps taken (training steps completed, skipped ones included)
  int64_t schedule_step = 0;  // the LR schedule's position (holds still on skipped fp16 steps)
  std::optional<optim::GradScalerState> scaler;
  std::string config;  // the run's configuration as JSON (what a resumed run is checked against)
};

struct Checkpoint {
  std::string dir;      // the directory the model and AdamW state came from (replica-K/ of a replicated one)
  std::string run_dir;  // the step directory (dir itself unless replicated)
  int replicas = 1;     // the replicas whose states run_dir holds
  int outer_files = 0;  // DiLoCo's outer-*-of-N files (N = the ranks of a replica), 0 if none
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
// The logical tensors this stage owns (its chunks' parameters, wte only on the first stage), in order, with their
// one-process element counts; and this rank's share of them: share dp·tp + tp of the stage's dp × tp writers.
std::vector<std::pair<std::string, int64_t>> logical_sizes(const Stage& stage);
KeepTensors checkpoint_share(const Stage& stage);
// AdamW's m and v of the logical tensors of this stage that `keep` names, whole. Collective over the dp group under
// ZeRO and over the tp group at tp > 1 (every rank calls it, whatever it keeps); local otherwise.
OptimizerCheckpoint optimizer_state(const optim::AdamW& optimizer, const Stage& stage, GradSync& sync,
                                    const KeepTensors& keep);

// The loss scaler's state as JSON text (scale, clean_steps, overflows_left, skipped_steps: in state.json and in a
// --save file's metadata) and back; the reader throws nlohmann::json's exception on a missing or mistyped field.
std::string scaler_state_json(const optim::GradScalerState& s);
optim::GradScalerState scaler_state_from_json(const std::string& text);

// Name of the checkpoint directory for a step: "step-00000020".
std::string checkpoint_name(int64_t step);

// Collective over the writers: this rank's part of the checkpoint directory `dir` (which must not exist yet),
// written atomically as described above (`model`, whole, is read on the leader only and may be null elsewhere;
// `optimizer` holds this rank's share of the logical tensors).
void save_checkpoint(const std::string& dir, const nn::GPT* model, const std::string& vocab_json,
                     const OptimizerCheckpoint& optimizer, const TrainingState& state, const CheckpointWriter& writer);

// Collective over the pp and tp groups of this dp replica (the other replicas hold the same values and return at
// once): `local` (one tensor per stage.named_parameters(), in that order, shaped like the parameter: a tp slice at
// tp > 1) as the whole model's tensors in nn::GPT's named_parameters() order (wte once, whole), on the CPU, where
// `keep` (the rank at grid coordinate (0, 0, 0) only; elsewhere an empty list).
nn::NamedTensors gather_stages(const Stage& stage, const nn::NamedTensors& local, bool keep);
// The whole model as a one-process GPT on the CPU where `keep` (null elsewhere): the stage's own model when it is
// one process's whole model. Collective as gather_stages.
std::shared_ptr<nn::GPT> consolidated_model(const Stage& stage, bool keep);
// Every MoE block's expert bias (a buffer: nn/moe.h's bias balancing), under its whole-model name, on every rank:
// collective over the pp group (each stage contributes its blocks'). Empty for a dense model.
nn::NamedTensors whole_expert_biases(const Stage& stage);

// Collective over the world, for R > 1 replicas: replica `replica`'s checkpoint (save_checkpoint's, `writer` within
// the replica) into dir/replica-K, DiLoCo's state (`outer`, non-null on replica 0's ranks; `outer_index` of
// `outer_count`), then the leader (`world_leader`) seals dir as above. `world_barrier` synchronises every rank.
struct OuterCheckpoint {
  std::vector<float> global, momentum;  // dist::OuterSync's, flat over this rank's parameters
};
std::string replica_dir_name(int replica);  // "replica-00001"
std::string outer_file_name(int index, int count);
void save_replicated_checkpoint(const std::string& dir, int replica, int replicas, const nn::GPT* model,
                                const std::string& vocab_json, const OptimizerCheckpoint& optimizer,
                                const TrainingState& state, const CheckpointWriter& writer,
                                const OuterCheckpoint* outer, int outer_index, bool world_leader,
                                const std::function<void()>& world_barrier);
// DiLoCo's state of rank `index` of `count` of a replica, from a replicated checkpoint; throws naming the file, or
// why it cannot serve (no DiLoCo state, another count of ranks per replica).
OuterCheckpoint load_outer_state(const Checkpoint& c, int index, int count);

// Reads and verifies a checkpoint directory; throws naming the file and the problem. A replicated one (above): its
// manifest and `replica`'s checkpoint.
Checkpoint load_checkpoint(const std::string& dir, int replica = 0);

// Every chunk's parameters from the whole model's tensors (by name; both copies of wte; at tp > 1 this rank's
// slices). Local. Throws naming a missing or misshapen tensor and the file.
void load_model(Stage& stage, const std::string& path);
// The checkpoint's weights (after checking its model config; before the GradSync shards them), and AdamW's m, v
// and step of this stage's parameters (this rank's slices at tp > 1, its shard under ZeRO). Local.
void restore_model(const Checkpoint& c, Stage& stage);
void restore_optimizer(const Checkpoint& c, const Stage& stage, GradSync& sync, optim::AdamW& optimizer);

// The complete checkpoints (step-* with DONE) in `parent`, newest first. Incomplete ones are reported through `log`
// and left out.
std::vector<std::string> complete_checkpoints(const std::string& parent,
                                              const std::function<void(const std::string&)>& log);
// The newest of them that loads and verifies (load_checkpoint), or none: one that fails is reported through `log`
// with the reason and skipped, so a restart after a crash never sticks on a damaged directory.
std::optional<Checkpoint> latest_checkpoint(const std::string& parent,
                                            const std::function<void(const std::string&)>& log, int replica = 0);

// Deletes all but the newest `keep` complete checkpoints in `parent` (and any *.tmp left by a crash).
void prune_checkpoints(const std::string& parent, int64_t keep);

// SIGTERM or SIGUSR1 received since install_preemption_handlers() (async-signal-safe flag).
void install_preemption_handlers();
bool preemption_requested();

}  // namespace minidl::train
