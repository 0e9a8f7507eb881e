// The scaling predictor: step time, memory and efficiency of a GPT training layout (dp × cp × tp × pp, virtual
// stages, micro-batches, ZeRO stage, recompute, amp, sequence parallelism) on a machine (predict/machine.h), from costs
// derived per op and per collective, not fitted to step times.
//
//   predict::Workload w{nn::GPTConfig{50257, 1024, 24, 16, 2048, 0.0, true}, 512};  // 512 sequences per step
//   predict::Layout l{.dp = 8, .tp = 4, .pp = 1, .micro_batches = 8, .amp = DType::bf16};
//   predict::Prediction p = predict::predict(w, l, predict::find_machine("a100-sxm"));
//   p.time.total(); p.memory_peak; p.mfu; p.efficiency;
//
// How the step is put together, on the busiest rank:
// - compute: per micro-batch, a pipeline rank's forward F and backward B are the roofline times of its blocks'
//   ops (predict/compute.h; plus the embedding on the first rank and the head on the last), with tensor
//   parallelism's all-reduces (2 per block forward, 2 backward, each of b·T·C activations; with sequence
//   parallelism the all-gathers and reduce-scatters dist/sequence_parallel.cpp runs, at their own links, with their
//   layout copies) on the critical path inside them. The blocks are cut into chunks by
//   dist::split_layers, as the trainer cuts them; the slowest rank's F and B are the pipeline's per-rank costs.
// - pipeline: the schedule's action lists (dist::make_schedule) run through dist::simulate with those costs; the
//   makespan less M·(F + B) is the bubble. Sends and receives overlap the other micro-batches' compute except on
//   the fill and the drain: 2·(p − 1) messages of b·T·C activations are exposed, plus the tied embedding's
//   all-reduce between the first and the last stage.
// - context parallelism (cp > 1, dist/context_parallel.h): a rank computes on T/cp of each sequence's positions
//   (every op's tokens / cp; attention's queries / cp against all T keys: 1/cp of its work, balanced head-tail), and
//   its ring sends, per block forward, cp - 1 K|V blocks of 2·b·(T/cp)·Hkv·D elements, each overlapping one step's
//   block attention (attention / cp) where the machine overlaps (not on the CPU host); backward sends the K|V
//   blocks again (overlapped the same way) and cp gradient blocks in f32 (exposed); recomputation reruns the
//   forward's. The cp ranks join the data-parallel collectives: DDP and ZeRO run over dp · cp ranks.
// - a mixture of experts (model.moe(), nn/moe.h): an MoE block's MLP half is its router, routing, dispatch, the
//   experts' GEMMs over the routed rows (predict/compute.h: moe_rows, a balanced router's), the combine and the
//   shared experts. Expert parallelism (ep > 1, dist/expert_parallel.h) adds per MoE block forward an all-to-all
//   of the counts and two of the rows (out and home), backward two more, blocking; a rank holds E/ep experts,
//   whose gradients all-reduce over the dp / ep ranks holding them, the dense ones over dp.
// - data parallelism: the gradients of the first pipeline rank (all of the model when pp = 1) are bucketed as
//   dist::assign_buckets buckets them (reverse order, 1 MiB first, 25 MiB cap), each bucket ready when backward
//   has passed its last block in the last micro-batch (accumulation does not synchronise before it); DDP
//   all-reduces each bucket, ZeRO 1-3 reduce-scatter it, on one stream overlapping the rest of that backward
//   (predict/overlap.h). ZeRO 1-2 then all-gather the updated parameters (exposed); ZeRO-3 also gathers every
//   block before its forward and its backward, each gather prefetched during the previous block's compute. On a
//   CPU machine (Machine::cpu) the collectives are the core's own work, so none of them is hidden. Within a node
//   each collective runs at the link the machine measured for it, if any (Machine::intra_for).
// - optimizer: AdamW's pass over the rank's parameters (its shard under ZeRO), a memory-bound op.
// - ZeRO's copies: the memory-bound work ZeRO 1-3 do beyond DDP's (predict/compute.h: zero_ops), on the rank's
//   critical path (the main thread copies and zeroes the gradient buckets, and casts ZeRO-3's gathered blocks).
// - memory: train::predict_memory's formulas by tag for the rank holding the most blocks, its activations times
//   the micro-batch chunks simulate() finds in flight on it (1F1B: up to p on the first rank).
// - local SGD and DiLoCo (--sync, predict/outer.h): a replica's step at global batch / R, plus every H steps an
//   all-reduce of the rank's parameters over the R replicas and the host passes around it, a step's share 1/H.
// - a parameter server (--ps S, predict/outer.h): a worker's forward and backward at global batch / W, then the
//   push and the pull, which a server answers one worker after another; sync applies AdamW once a step, async and
//   SSP once a push, so their step is the slower of one worker's round and a server's W answers.
// Efficiency against one GPU: the same global batch and micro-batch on one GPU (accumulating), over N times this
// layout's step time; MFU: nanoGPT's model FLOPs over step time × N × the dense peak of the products' dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/pipeline.h"
#include "nn/gpt.h"
#include "predict/compute.h"
#include "predict/machine.h"
#include "train/zero_memory.h"

namespace minidl::predict {

struct Workload {
  nn::GPTConfig model;       // block_size is the sequence length T
  int64_t global_batch = 1;  // sequences per optimizer step, over all data-parallel ranks
};

// How replicas or workers meet beyond one synchronous group (train_gpt's --sync, --ps-mode).
enum class OuterSync { kNone, kLocalSgd, kDiLoCo };
enum class PsMode { kSync, kAsync, kSsp };
// train_gpt's --sync (ddp, local-sgd, diloco) and --ps-mode (sync, async, ssp:S), parsed as the trainer parses them
// (dist::outer_kind, dist::ps_options): a bad name throws naming the accepted ones.
OuterSync parse_outer_sync(const std::string& name);
PsMode parse_ps_mode(const std::string& text);

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int virtual_stages = 1;  // V > 1: the interleaved schedule
  int micro_batches = 1;   // M per step on each data-parallel rank (accumulation when pp = 1)
  int zero = 0;            // 0: DDP
  nn::Recompute recompute = nn::Recompute::kNone;
  DType amp = DType::f32;
  bool sequence_parallel = false;
  // With pp > 1, as train_gpt's --schedule: virtual_stages > 1 needs kInterleaved (gpipe and 1f1b run one chunk
  // per rank), and kInterleaved needs them.
  dist::ScheduleKind schedule = dist::ScheduleKind::k1F1B;
  // --sync local-sgd | diloco: `replicas` copies of the layout above train apart and meet every `sync_every` steps.
  OuterSync sync = OuterSync::kNone;
  int replicas = 1, sync_every = 1;
  // --ps S: dp workers (tp = pp = 1, no ZeRO) train whole models; S more ranks hold the parameters and step them.
  int ps_servers = 0;
  PsMode ps_mode = PsMode::kSync;
  // --cp: each sequence over cp ranks (ring attention); the gradients averaged over dp · cp ranks.
  int cp = 1;
  // --ep: a mixture of experts' experts spread over groups of ep of the dp ranks (a divisor of dp and of E; not
  // an axis of the grid: gpus() is unchanged).
  int ep = 1;
  int gpus() const { return dp * cp * tp * pp * replicas + ps_servers; }
};
std::string describe(const Layout& l);  // "dp 8 tp 4 pp 1 M 8 zero 1 bf16 ..."

// Seconds per optimizer step, by where they go. total() is their sum.
struct StepTime {
  double compute = 0;      // forward, backward and recompute of M micro-batches on the busiest rank
  double tp_comm = 0;      // tensor parallelism's collectives (blocking, inside forward and backward)
  double pp_comm = 0;      // pipeline sends and receives exposed on the fill and drain; the tied embedding's all-reduce
  double dp_comm = 0;      // data parallelism's exposed collectives (last buckets, ZeRO's gathers)
  double bubble = 0;       // pipeline idle time on the busiest rank
  double optimizer = 0;    // AdamW (and the 16-bit weight copies)
  double zero_copies = 0;  // ZeRO's gradient copies, bucket zeroing and per-gather casts beyond DDP's (zero_ops)
  double outer = 0;    // local SGD's or DiLoCo's sync over the replicas, a step's share; a parameter server's exchange
  double cp_comm = 0;  // context parallelism's ring sends not hidden behind attention (inside forward and backward)
  double ep_comm = 0;  // expert parallelism's all-to-alls (blocking, inside forward and backward)
  double total() const {
    return compute + tp_comm + pp_comm + dp_comm + bubble + optimizer + zero_copies + outer + cp_comm + ep_comm;
  }
};

struct Prediction {
  Workload workload;
  Layout layout;
  StepTime time;
  ClassSeconds compute_by_class;     // time.compute by op class (products, attention, memory-bound ops)
  double dp_comm_total = 0;          // all of data parallelism's collective time, hidden or not
  const char* dp_collective = "";    // "all-reduce", "reduce-scatter + all-gather", ...
  int64_t micro_batch = 0;           // b: sequences per micro-batch per rank
  double rank_params = 0;            // parameters the first pipeline rank holds (its tp slice)
  double forward = 0, backward = 0;  // per micro-batch on the busiest pipeline rank, passed to dist::simulate
  double bubble_fraction = 0;        // dist::simulate's, for those costs
  train::MemoryPlan memory;          // of one micro-batch in flight
  int activations_in_flight = 1;     // micro-batch chunks held at once (simulate's peak, over V chunks)
  double activation_bytes = 0;       // memory.activations × in flight / V
  double memory_peak = 0;
  bool fits = false;       // memory_peak <= the machine's capacity
  double model_flops = 0;  // per step (nanoGPT's convention)
  double mfu = 0, tokens_per_s = 0;
  double single_gpu_step = 0, efficiency = 1;
};

// Why a layout cannot run this workload (empty when it can; memory is not checked here): the grid, tp dividing
// the heads, pp·V at most the layers, micro-batches dividing the per-rank batch, interleaving's M multiple of pp,
// ZeRO stage 0-3 and not 3 with pp > 1, sequence parallelism only with tp > 1; local SGD and DiLoCo with R >= 1
// replicas, H >= 1 and ZeRO at most 2 (the trainer's --sync ddp is R 1, H 1); a parameter server with whole
// models on its workers (tp = pp = 1, ZeRO 0, no outer sync).
std::string refusal(const Workload& w, const Layout& l);

// Throws minidl::Error with refusal()'s reason when the layout cannot run.
Prediction predict(const Workload& w, const Layout& l, const Machine& machine);

// The pipeline part alone: dist::simulate's makespan and bubble for per-rank costs F and B (tests compare it with
// simulate and with (p − 1)/(V·M + p − 1)).
struct PipelineTime {
  double makespan = 0, bubble = 0, bubble_fraction = 0;
  int peak_in_flight = 1;
};
PipelineTime pipeline_time(const dist::PipelineSpec& spec, double forward, double backward);

// --plan: every layout of `gpus` GPUs (dp·tp·pp = gpus; V 1, or 2 with pp > 1; M dividing the per-rank batch, at
// most max_micro_batches; ZeRO 0-3; recompute none or block; sequence parallelism off, or on with tp > 1; amp as
// given) with its prediction, or the reason it is refused (including not fitting in budget_bytes per GPU).
struct PlanRow {
  Layout layout;
  std::string refused;    // empty: valid
  Prediction prediction;  // when valid
};
// Valid rows first, fastest first (ties: less memory, then the layout's text), then the refused ones.
std::vector<PlanRow> plan(const Workload& w, int gpus, DType amp, const Machine& machine, double budget_bytes,
                          int max_micro_batches = 64);

}  // namespace minidl::predict
