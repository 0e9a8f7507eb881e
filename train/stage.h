// train::Stage: the part of the model one rank trains, as one or more model chunks, and the schedule that runs
// them. Every run is a pipeline: pp = 1 is one stage holding one chunk with the whole model, whose schedule (1F1B
// over one stage) is the gradient-accumulation loop; pp > 1 splits the blocks over the stages; tp > 1 splits every
// chunk over the tensor-parallel group (by the chunk factory the caller passes). The executor (train/step.h) runs the
// schedule, whatever the layout.
//
//   dist::Topology topo(world, {.dp = 1, .tp = 1, .pp = 2}, "mpi");
//   dist::PipelineSpec spec{.kind = dist::ScheduleKind::k1F1B, .stages = 2, .micro_batches = 4};
//   train::Stage stage(cfg, seed, spec, dist::split_layers(...), topo);    // validates the schedule
//   train::Stage one = train::Stage::of(model, /*micro_batches=*/4);       // a one-process GPT, not owned
//
// What a rank holds: local chunk v is global chunk c = v·pp + pp_rank, a GPT holding blocks
// [starts[c], starts[c + 1]), plus the embedding (wte, wpe) on chunk 0 and ln_f with the tied head on the last
// chunk, so with pp > 1 wte lives on the first and the last stage (two copies, initialised identically by global
// parameter index: nn/gpt.h).
//
// The layout of every parameter is the parameter's own (nn::layout_of: held whole, split over the tp group, or
// replicated on it: LayerNorms, wpe, row-parallel biases); the stage adds only what a pipeline knows: whether it is
// the tied copy of wte on the last stage (the first stage's copy is the one that counts).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "dist/context_parallel.h"
#include "dist/pipeline.h"
#include "dist/topology.h"
#include "nn/gpt.h"

namespace minidl::train {

class Stage {
 public:
  // Makes the chunk `part` of the whole model (cfg, seed) on this rank. By default nn::GPT's constructor; a
  // parallelism applied from outside supplies its own (train/parallel_model.cpp: tensor parallelism over the tp
  // group). The chunk's parameters carry their layouts (nn/param_layout.h): the stage reads them, never the class.
  using ChunkFactory =
      std::function<std::shared_ptr<nn::GPT>(const nn::GPTConfig& cfg, uint64_t seed, const nn::GPTStage& part)>;
  // This rank's chunks of the whole model (cfg, seed) for `spec` on `topology`, and the schedule, validated (throws
  // naming the ranks and the action on a bad schedule, before anything is sent). starts: chunks + 1 block
  // boundaries (dist::split_layers). With tp > 1, make_chunk splits each chunk over the tp group; with sequence
  // parallelism what crosses a stage boundary is split along the sequence too: (micro, T / tp, C).
  Stage(const nn::GPTConfig& cfg, uint64_t seed, const dist::PipelineSpec& spec, const std::vector<int64_t>& starts,
        const dist::Topology& topology, const ChunkFactory& make_chunk = {});
  // A model the caller owns (it must outlive the stage) as one stage of one chunk over `micro_batches`: what one
  // process, or a data-parallel rank, trains. A tensor-parallel split keeps its layouts (on its parameters).
  static Stage of(nn::GPT& model, int micro_batches = 1);

  const dist::Schedule& schedule() const { return schedule_; }
  const dist::PipelineSpec& spec() const { return schedule_.spec; }
  int rank() const { return rank_; }
  bool first_stage() const { return rank_ == 0; }
  bool last_stage() const { return rank_ == spec().stages - 1; }
  int64_t global_chunk(int v) const { return int64_t(v) * spec().stages + rank_; }
  bool is_last_chunk(int v) const { return global_chunk(v) == spec().chunks() - 1; }
  // Whether a mixture of experts' experts are spread over ranks (dist/expert_parallel.h): its forwards exchange
  // tokens, so every rank of the group must run as many.
  bool expert_parallel() const;
  int chunk_count() const { return int(chunks_.size()); }
  nn::GPT& chunk(int v) const { return *chunks_[size_t(v)]; }
  const nn::GPTConfig& config() const { return chunks_.front()->config(); }
  // The topology and its pp group (null for Stage::of: one process, or one rank of a group the caller drives).
  const dist::Topology* topology() const { return topology_; }
  dist::ProcessGroup* pp_group() const { return topology_ ? &topology_->pp_group() : nullptr; }

  // Every chunk's parameters, whole-model names, chunk by chunk.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  Device device() const { return parameters().front().device(); }

  // The tied wte this stage holds when pp > 1 (the embedding's on the first stage, the head's on the last; their
  // gradients are summed over the embedding group); undefined otherwise.
  Tensor tied_weight() const { return tied_weight_; }
  // Whether p is the last stage's copy of the tied wte (its values are the first stage's: counted once).
  bool is_tied_copy(const Tensor& p) const { return tied_copy_.defined() && p.impl() == tied_copy_.impl(); }
  // Whether this stage writes `name` in a checkpoint: every parameter but the last stage's copy of wte.
  bool owns(const std::string& name) const;
  // Positions of a sequence of T tokens that one rank holds between blocks: the second dimension of what crosses a
  // stage boundary. T / n when the chunks' parameters act on a slice of the sequence (nn::ParamLayout's
  // sequence_sliced, over n ranks: sequence parallelism).
  int64_t positions_per_rank(int64_t T) const { return T / sequence_shards_; }

  // Context parallelism (dist/context_parallel.h): every chunk computes on cp's positions of each sequence (its
  // attention a ring over cp's group), and the executor and evaluate hand it those positions (positions_of).
  // Null: the whole sequence. Shared: the chunks' styles read it.
  void set_context_parallel(std::shared_ptr<const dist::ContextParallel> cp);
  const dist::ContextParallel* context_parallel() const { return cp_.get(); }
  // The ranks one sequence is split over (1 without context parallelism).
  int context_parallel_size() const { return cp_ ? cp_->size() : 1; }
  // This rank's positions of t (B, T, ...): cp's split, or t itself.
  Tensor positions_of(const Tensor& t) const { return cp_ ? cp_->split(t) : t; }

  void to(Device device);
  void train(bool on = true);
  void set_recompute(nn::Recompute r);
  // The dropout position of every chunk (all chunks draw as the whole model would).
  void set_dropout(uint64_t step, int64_t first_sample);
  uint64_t dropout_step() const { return chunks_.front()->dropout_context().step; }
  int64_t dropout_first_sample() const { return chunks_.front()->dropout_context().first_sample; }
  // Collective over the pp group: the whole model's parameter count (wte once, whole tensors) and training FLOPs
  // per token.
  int64_t num_parameters() const;
  double flops_per_token(int64_t T) const;

  // The measured bubble: how long this rank's schedule ran, and how much of that it sat waiting for a peer (on a
  // posted receive, or on its sends before the optimizer step), summed over the steps since reset_timing(). On an
  // ideal machine wait_ms / schedule_ms is the simulated bubble, (p - 1) / (M + p - 1) under GPipe and 1F1B.
  struct Timing {
    double schedule_ms = 0, wait_ms = 0;
    int64_t steps = 0;
  };
  Timing& timing() const { return *timing_; }
  void reset_timing() { *timing_ = {}; }

 private:
  Stage(const dist::PipelineSpec& spec, const dist::Topology* topology);
  void add_chunk(std::shared_ptr<nn::GPT> chunk);

  const dist::Topology* topology_ = nullptr;
  dist::Schedule schedule_;
  int rank_ = 0;
  int64_t sequence_shards_ = 1;
  std::vector<std::shared_ptr<nn::GPT>> chunks_;
  std::shared_ptr<const dist::ContextParallel> cp_;
  Tensor tied_weight_, tied_copy_;
  std::shared_ptr<Timing> timing_ = std::make_shared<Timing>();
};

}  // namespace minidl::train
