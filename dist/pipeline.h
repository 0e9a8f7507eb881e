// Pipeline schedules as data: for every pipeline rank, the ordered list of what it does in one optimizer step
// (forward micro-batch m through model chunk v, backward, post a send or a receive of an activation or of its
// gradient, the optimizer step). Nothing here talks to MPI: a schedule is built, validated, simulated and drawn as
// plain data, and an executor (train/step.h) then runs the list it is given, action by action.
//
//   dist::PipelineSpec spec{.kind = dist::ScheduleKind::k1F1B, .stages = 4, .micro_batches = 8};
//   dist::Schedule s = dist::make_schedule(spec);        // s.ranks[r]: rank r's actions, in posting order
//   dist::validate_schedule(s);                          // throws, naming the ranks and the action, on a bug
//   dist::SimResult sim = dist::simulate(s);             // sim.bubble_fraction() == 3 / 11
//   std::puts(dist::draw_schedule(s).c_str());           // the per-rank timeline (train_gpt --print-schedule)
//
// Model chunks. The model's blocks are cut into p·V contiguous chunks (V "virtual stages" per rank; V = 1 but for
// the interleaved schedule). Global chunk c lives on rank c mod p as its local chunk v = c / p (Megatron's
// interleaving: rank 0 holds chunks 0, p, 2p, ...). Chunk 0 also holds the embedding, chunk p·V − 1 ln_f, the tied
// head and the loss. The activation of micro-batch m leaving chunk c goes to chunk c + 1, on rank (c + 1) mod p;
// its gradient comes back the other way.
//
// The schedules (p ranks, M micro-batches, forward time F, backward time B):
// - GPipe (Huang et al. 2019): every forward, then every backward. Rank r starts its first forward after r·F and its
//   last backward ends (M + p − 1)(F + B) after the start: each rank idles (p − 1)(F + B) of that, the bubble
//   fraction (p − 1)/(M + p − 1). It keeps the activations of all M micro-batches until their backward.
// - 1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs p − r − 1 warm-up forwards, then alternates one
//   forward and one backward, then drains the remaining backwards. Same bubble as GPipe, but at most min(M, p − r)
//   micro-batches are in flight on rank r: activation memory p instead of M micro-batches on the first stage.
// - Interleaved 1F1B (Narayanan et al. 2021, §2.2.2): V chunks per rank; forwards run in groups of p micro-batches
//   per chunk (chunk 0 for micro-batches 0..p−1, chunk 1 for the same, ..., then the next group), backwards in the
//   mirrored order; warm-up (p − r − 1)·2 + (V − 1)·p forwards. A chunk's forward takes F/V, so the pipeline fills
//   V times faster: the paper states the bubble as a fraction of the ideal time, t_bubble / t_ideal = (1/V)·(p−1)/M;
//   as a fraction of the whole step (what simulate() measures) that is (p − 1)/(V·M + p − 1). M must be a multiple
//   of p (each group is p micro-batches). The price: V times as many point-to-point messages.
//
// Communication volume, per micro-batch of b sequences of T tokens and width C (element size s bytes): every chunk
// boundary carries the activation (b·T·C·s bytes) forward and its gradient (the same) back, so a step moves
// 2·M·(p·V − 1)·b·T·C·s bytes in total, of which each rank sends at most 2·M·V·b·T·C·s — independent of the depth
// of the model, unlike data parallelism's 2·(N−1)/N·Ψ·s per rank for Ψ parameters. Plus one all-reduce of the tied
// wte (V·C elements) between the first and the last stage.
//
// Activation memory on a rank, with A bytes of saved activations per micro-batch per chunk: GPipe keeps M·V·A at its
// peak (every forward before any backward); 1F1B keeps min(M, p − r)·A on rank r (its warm-up plus the one in
// flight); interleaved keeps about (warm-up + 1)·A. simulate() reports the peak count of micro-batch-chunks in
// flight per rank, which the memory ledger's activation peak per stage should follow.
//
// Posting order. NCCL has no tags: between two ranks, the k-th receive posted matches the k-th send posted, whatever
// the receiver meant it for. At p = 2 both directions of an interleaved schedule join the same two ranks (Megatron
// #750), so a receiver that posted "gradient of m" before "activation of m + 1" while the sender did the opposite
// would silently swap two tensors of the same shape. make_schedule therefore posts each rank's receives from a
// peer in the order that peer posts its sends (receives are posted early and waited for by the compute that needs
// them), and validate_schedule checks, pair by pair, that the k-th send and the k-th receive are the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace minidl::dist {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved };
// "gpipe", "1f1b", "interleaved"; anything else is an error listing them.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind kind);

struct PipelineSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;          // p: pipeline ranks
  int micro_batches = 1;   // M per optimizer step
  int virtual_stages = 1;  // V: model chunks per rank (interleaved only; 1 otherwise)
  // Throws naming the field, what was expected and what was given (M a multiple of p for interleaved, ...).
  void validate() const;
  int chunks() const { return stages * virtual_stages; }
};

enum class ActionKind {
  kForward,         // run micro-batch `micro` through local chunk `chunk`
  kBackward,        // backward of that forward
  kSendActivation,  // post the send of the output of (micro, chunk) to `peer`
  kRecvActivation,  // post the receive of the input of (micro, chunk) from `peer`
  kSendGrad,        // post the send of the gradient of the input of (micro, chunk) to `peer`
  kRecvGrad,        // post the receive of the gradient of the output of (micro, chunk) from `peer`
  kOptimizerStep,   // every backward is done: synchronise gradients and step
};
const char* action_kind_name(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro = 0;
  int chunk = 0;  // local chunk v on this rank (global chunk v·p + rank)
  int peer = -1;  // pipeline rank of the other side of a send/receive; -1 for compute
  bool operator==(const Action&) const = default;
};
// "forward m=3 v=0", "send activation m=3 v=0 to rank 1", ...
std::string describe(const Action& a);

struct Schedule {
  PipelineSpec spec;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in the order it posts them
};

// The action lists of spec's schedule for every rank (spec is validated first).
Schedule make_schedule(const PipelineSpec& spec);

// The tag of a message on tagged transports (MPI on the CPU): distinct for every (direction, micro, global chunk) of
// a step, at most ProcessGroup::kMaxTag (checked by PipelineSpec::validate).
int message_tag(const PipelineSpec& spec, const Action& a, int rank);

// Checks, before the first step, that the schedule can run: every rank's list holds each forward and backward of its
// chunks exactly once and ends with the optimizer step; no rank sends to or receives from itself; between every
// ordered pair of ranks the k-th send posted and the k-th receive posted are the same message (posting order, for
// transports without tags); and executing the lists cannot deadlock (simulate()). Throws minidl::Error naming the
// ranks, the position and the action at fault.
void validate_schedule(const Schedule& schedule);

struct SimResult {
  double makespan = 0;              // time from the first action to the last optimizer step
  std::vector<double> busy;         // per rank: time spent computing
  std::vector<int> peak_in_flight;  // per rank: most (micro, chunk) forwards whose backward had not yet run
  // Per rank: [start, end) of every compute action, in list order (index into schedule.ranks[r]).
  std::vector<std::vector<std::pair<double, double>>> slots;
  // Idle time over the total, averaged over the ranks: 1 − Σ busy / (p · makespan).
  double bubble_fraction() const;
};

// Runs the lists with unit costs: a chunk's forward takes forward_time / V, its backward backward_time / V; posting
// a send or a receive takes no time, a message arrives the moment its send is posted, and a compute waits for the
// messages it needs. Throws (naming every stuck rank and the action it waits at) if the lists deadlock.
SimResult simulate(const Schedule& schedule, double forward_time = 1.0, double backward_time = 2.0);

// The per-rank timeline, one row per rank and one cell per unit of time, like the figures of the GPipe and
// Megatron papers: "F3" forward of micro-batch 3, "B3" its backward (two cells with the default costs), a letter
// after the number for the chunk when V > 1, "." idle; then the simulated bubble beside the formula's.
std::string draw_schedule(const Schedule& schedule);

// The analytic bubble fraction of the whole step: (p − 1)/(V·M + p − 1) (V = 1 for GPipe and 1F1B).
double bubble_formula(const PipelineSpec& spec);

// Splits n_layer blocks into `chunks` contiguous, non-empty ranges by parameter count: block i costs block_params,
// the first chunk also first_extra (the embeddings), the last last_extra (ln_f and the head); minimises the largest
// chunk (ties: the earliest cut). Returns the chunks' first blocks plus n_layer at the end (chunks + 1 entries).
// Throws if there are more chunks than blocks.
std::vector<int64_t> split_layers(int64_t n_layer, int chunks, int64_t block_params, int64_t first_extra,
                                  int64_t last_extra);
// "2,2,1,..." (--pp-layers): the blocks per chunk; must be chunks positive counts summing to n_layer.
std::vector<int64_t> parse_layer_split(const std::string& text, int64_t n_layer, int chunks);

}  // namespace minidl::dist
