// Pipeline-parallel training: this rank's model chunks, the executor of a schedule's action list
// (dist/pipeline.h), the gradient synchronisation a pipeline needs, the step and the evaluation.
//
//   dist::Topology topo(world, {.dp = 1, .tp = 1, .pp = 2}, "mpi");
//   dist::PipelineSpec spec{.kind = dist::ScheduleKind::k1F1B, .stages = 2, .micro_batches = 4};
//   train::PipelineModel pipe(cfg, seed, spec, dist::split_layers(...), topo);   // validates the schedule
//   train::PipelineSync sync(pipe, topo);
//   train::StepOptions o;  o.grad_sync = &sync;                                    // grad_accum is ignored: M is
//   train::StepResult r = train::pipeline_train_step(pipe, adamw, batch, o);       // the spec's micro-batches
//
// What a rank holds: local chunk v is global chunk c = v·pp + pp_rank, a GPT holding blocks
// [starts[c], starts[c + 1]), plus the embedding (wte, wpe) on chunk 0 and ln_f with the tied head on the last
// chunk, so wte lives on the first and the last pipeline stage (two copies, initialised identically by global
// parameter index). Activations (micro, T, C) go forward and their gradients back by send/recv on the pp group,
// with the tag of dist::message_tag (ignored by transports that match in posting order, which the schedule's
// validation made safe). The loss exists on the last stage only; pipeline_train_step returns it on every rank.
//
// Equivalence with one process and --grad-accum M: every chunk runs the backward of micro-batch 0, 1, ..., M − 1
// in that order, with the same normaliser (1 / target tokens of the whole batch) and the same dropout positions, so
// every gradient is bitwise the same except wte's, whose embedding and head contributions are added in another
// order (the all-reduce over the embedding group adds the two sums).
#pragma once

#include <memory>
#include <vector>

#include "dist/pipeline.h"
#include "dist/topology.h"
#include "nn/gpt.h"
#include "train/grad_sync.h"
#include "train/step.h"

namespace minidl::dist {
class ZeroDataParallel;
}  // namespace minidl::dist

namespace minidl::train {

class PipelineModel {
 public:
  // Builds this rank's chunks of the whole model (cfg, seed) and the schedule, and validates it (throws naming the
  // ranks and the action on a bad schedule, before anything is sent). starts: chunks + 1 block boundaries
  // (dist::split_layers). Needs pp >= 2. With tp > 1 in the topology every chunk is a dist::TensorParallelGPT
  // stage split over the tp group (tensor-parallel blocks, the vocabulary-parallel embedding and head), and
  // sequence_parallel splits what crosses a stage boundary along the sequence too: (micro, T / tp, C).
  PipelineModel(const nn::GPTConfig& cfg, uint64_t seed, const dist::PipelineSpec& spec,
                const std::vector<int64_t>& starts, const dist::Topology& topology, bool sequence_parallel = false);

  const dist::Schedule& schedule() const { return schedule_; }
  const dist::PipelineSpec& spec() const { return schedule_.spec; }
  int rank() const { return rank_; }
  bool first_stage() const { return rank_ == 0; }
  bool last_stage() const { return rank_ == spec().stages - 1; }
  int64_t global_chunk(int v) const { return int64_t(v) * spec().stages + rank_; }
  std::vector<std::unique_ptr<nn::GPT>>& chunks() { return chunks_; }
  const std::vector<std::unique_ptr<nn::GPT>>& chunks() const { return chunks_; }
  const nn::GPTConfig& config() const { return chunks_.front()->config(); }
  dist::ProcessGroup& pp_group() const { return topology_.pp_group(); }
  const dist::Topology& topology() const { return topology_; }

  // Every chunk's parameters, whole-model names.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The tied wte held by the last stage's head (the first stage holds the other copy); undefined elsewhere.
  Tensor head_wte() const;
  // The tied wte of the first stage's embedding; undefined elsewhere.
  Tensor embedding_wte() const;
  // Positions of a sequence of T tokens that one rank of this stage holds between blocks (T / tp with sequence
  // parallelism): the second dimension of what crosses a stage boundary.
  int64_t positions_per_rank(int64_t T) const;
  // The parameters a tensor-parallel group holds whole on every rank (LayerNorms, wpe, row-parallel biases); empty
  // at tp 1.
  std::vector<Tensor> replicated_parameters() const;
  void to(Device device);
  void train(bool on = true);
  void set_recompute(nn::Recompute r);
  void zero_grad();
  // The dropout position of every chunk (all chunks draw as the whole model would).
  void set_dropout(uint64_t step, int64_t first_sample);
  uint64_t dropout_step() const { return chunks_.front()->dropout_context().step; }
  int64_t dropout_first_sample() const { return chunks_.front()->dropout_context().first_sample; }
  // Collective over the pp group: the whole model's parameter count (wte once) and training FLOPs per token.
  int64_t num_parameters() const;
  double flops_per_token(int64_t T) const;

  // The measured bubble: how long this rank's schedule ran, and how much of that it sat waiting for a peer (on a
  // posted receive, or on its sends before the optimizer step), summed over the steps since reset_timing(). On an
  // ideal machine wait_ms / schedule_ms is the simulated bubble, (p - 1) / (M + p - 1) under GPipe and 1F1B.
  struct Timing {
    double schedule_ms = 0, wait_ms = 0;
    int64_t steps = 0;
  };
  const Timing& timing() const { return timing_; }
  Timing& timing() { return timing_; }
  void reset_timing() { timing_ = {}; }

 private:
  const dist::Topology& topology_;
  dist::Schedule schedule_;
  int rank_ = 0;
  bool sequence_parallel_ = false;
  std::vector<std::unique_ptr<nn::GPT>> chunks_;
  Timing timing_;
};

// Gradient synchronisation of a pipeline stage, after the step's last backward: the tied wte's gradient summed over
// the embedding group (first + last stage), then, with dp > 1, every gradient averaged over the dp group (one
// all-reduce per parameter, after the last micro-batch only). The gradient norm sums every stage's squares over
// the model-parallel group with wte counted once (the last stage leaves its copy out); the overflow flag is the
// max over the dp and model-parallel groups.
//
// zero_stage 1 or 2: ZeRO over the stage's dp group (dist::ZeroDataParallel over the stage's chunks, its reducer
// kept under no_sync): instead of the all-reduce, the summed gradients are reduce-scattered (average) into this
// rank's shard (ZeroDataParallel::reduce_scatter_gradients) and the full gradients dropped; unscale, clip and the
// optimizer see the shard (owned_params), after_step all-gathers the updated parameters. The norm adds the shards
// over the dp group. Stage 1 and 2 differ only in where the reduced gradients live (a persistent bucket or a
// shard); neither overlaps with backward, which a pipeline's many backward calls per step would make unsafe.
class PipelineSync final : public GradSync {
 public:
  PipelineSync(PipelineModel& pipe, const dist::Topology& topology, int zero_stage = 0);
  ~PipelineSync() override;
  const char* name() const override;
  void after_backward() override;
  std::vector<Tensor> owned_params(const std::vector<Tensor>& params) override;
  Tensor origin(const Tensor& owned) const override;
  std::vector<optim::ParamGroup> optimizer_groups(std::vector<optim::ParamGroup> groups) override;
  void after_step() override;
  double grad_norm_squared(const std::vector<Tensor>& params) override;
  bool combine_overflow(bool local) override;
  Tensor grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) override;
  void combine_overflow_on_device(const Tensor& found_inf) override;
  dist::ReducerStats comm_stats() const override { return stats_; }
  // ZeRO over the stage's dp group (zero_stage 1 or 2), or null: where a checkpoint finds the optimizer's shards
  // (train/pipeline_checkpoint.h).
  dist::ZeroDataParallel* zero();

 private:
  struct Zero;  // the sharding, with zero_stage > 0
  PipelineModel& pipe_;
  const dist::Topology& topology_;
  dist::ReducerStats stats_;
  std::unique_ptr<Zero> zero_;
};

// The forward and backward half of pipeline_train_step: runs this rank's action list over `batch` (split into the
// schedule's M micro-batches) and then options.grad_sync->after_backward(), leaving the gradients (scaled by the
// scaler, if any) in .grad(); advances the chunks' dropout step. Returns the batch's mean loss on the last stage, 0
// on the others (no communication beyond the pipeline's own; on a device the last stage reads it back, which
// pipeline_train_step does not). Collective over the pp group.
double pipeline_forward_backward(PipelineModel& pipe, const data::Batch& batch, const StepOptions& options);

// Runs this rank's action list for one step over `batch` (this dp rank's slice, every pp rank passing the same
// one), split into the schedule's M micro-batches: forwards, backwards, sends and receives; then GradSync's
// after_backward, unscale, clip, the optimizer step and zero_grad as train_step does. r.loss is the batch's mean
// loss on every pp rank (computed on the last stage, shared over the pp group). Collective over the pp group.
// On a CUDA device nothing is read back, as in train_step: a host batch is checked on the host and uploaded once
// (ids to the first stage, targets to the last), the loss is shared by an all-reduce of a device scalar (zeros on
// the other stages) and, with options.read_back false, waits in r.on_device.loss until StepResult::read().
StepResult pipeline_train_step(PipelineModel& pipe, optim::Optimizer& optimizer, const data::Batch& batch,
                               const StepOptions& options);

// train::evaluate for a pipeline: each batch of windows flows through the chunks in order; the last stage's
// per-batch loss sums are shared over the pp group (and the batches dealt over the dp group as evaluate does),
// so every rank returns the value one process computes, bit for bit. Collective over the pp and dp groups.
double pipeline_evaluate(PipelineModel& pipe, const data::Batch& windows, int64_t batch);

}  // namespace minidl::train
