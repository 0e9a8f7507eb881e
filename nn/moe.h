// A mixture-of-experts MLP (nn::GPT with cfg.moe_experts > 0, in the Llama blocks cfg.moe_layer() selects): a
// router sends each token to k of E SwiGLU experts and adds their outputs, weighted by its gates, plus (optionally)
// a shared expert every token passes through. As transformers' MixtralSparseMoeBlock with the router's choices:
//
//   scores = softmax(x @ router) (f32)          or  sigmoid(x @ router)                     (E per token)
//   chosen = top-k of scores                    or  top-k of scores + expert_bias            (bias: choice only)
//   gates  = scores[chosen] / sum(scores[chosen])   (renormalised when k > 1)
//   y      = sum_j gates_j * expert_{chosen_j}(x)  +  shared(x)
//
// Computed as a dispatch: the token copies ("slots", token-major: token t's j-th choice is slot t k + j) are
// gathered in expert-major order, each expert runs one GEMM chain over its rows, and the rows are gathered back to
// their slots (the inverse permutation), weighted and summed over each token's k slots in choice order.
//
// Capacity (cfg.moe_capacity > 0): an expert takes at most ceil(capacity · T k / E) of each sequence's T tokens'
// slots, the earliest slots first (GShard's and Switch's order); a dropped slot adds nothing, so a token whose every
// choice was dropped passes through the block's residual alone. 0: dropless. Per sequence, not per forward, so
// which slots drop does not depend on how a batch is split over ranks and micro-batches.
//
// Balancing (cfg.moe_balance):
// - aux: the Switch/HF auxiliary loss α·E·Σᵢ fᵢ·Pᵢ, with fᵢ the fraction of a sequence's tokens sent to expert i
//   (counting each of the k slots, so Σᵢ fᵢ = k) and Pᵢ the sequence's mean router probability of i; per sequence
//   (Megatron's seq_aux_loss: HF pools a whole batch, which equals it at batch 1), averaged over the forward's
//   sequences and summed over the MoE layers. A sequence-wise loss is a mean over sequences like the cross-entropy,
//   so data parallelism and accumulation compute exactly one process's loss. It enters backward without a
//   collection step: the layer's output carries it (Megatron's MoEAuxLossAutoScaler), its gradient weight
//   MoEContext::aux_weight, and a pipeline stage's layers add theirs where they run.
// - bias: DeepSeek-V3's auxiliary-loss-free balancing. expert_bias (a buffer, not trained) only chooses experts;
//   once per optimizer step, the tokens each expert was sent (summed over micro-batches, counted in backward so a
//   recomputed forward is not counted twice) move it by rate · sign(mean − countᵢ), centred (torchtitan's update).
// - none.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "nn/llama.h"

namespace minidl::nn {

// Which experts a forward's tokens go to, and where their copies sit once dispatched (host-side arithmetic; the
// unit tests' golden cases).
struct Routing {
  int64_t tokens = 0, k = 0, experts = 0;
  std::vector<int32_t> expert;  // (tokens k) the expert of each slot, token-major, each token's in choice order
  std::vector<int64_t> routed;  // (experts) slots sent to each expert, before capacity
  std::vector<int64_t> kept;    // (experts) slots each expert runs, after capacity
  std::vector<int64_t> order;   // the kept slots, expert-major (each expert's in slot order): dispatch row -> slot
  std::vector<int64_t> row;     // (tokens k) each slot's dispatch row, or -1 where capacity dropped it
};

// The top k of each token's row of `choice` (tokens, experts), ties to the lower expert, then capacity: at most
// `capacity` of each sequence's slots per expert (-1: no limit), the earliest kept; the tokens are whole sequences
// of `sequence` (<= 0: one sequence of them all).
Routing route(const std::vector<double>& choice, int64_t tokens, int64_t experts, int64_t k, int64_t capacity,
              int64_t sequence = 0);
// ceil(factor · tokens · k / experts) (tokens: a sequence's); factor <= 0: -1 (dropless).
int64_t expert_capacity(double factor, int64_t tokens, int64_t k, int64_t experts);

// Rows laid out group-major (group g's rows for expert 0, then expert 1, ...; `counts` (groups · experts) their
// numbers) -> the row indices that reorder them expert-major (expert 0's rows of group 0, of group 1, ..., then
// expert 1's), as expert parallelism receives tokens from its peers and an expert reads them as one block.
// counts [2, 3, 1, 4] over 2 groups of 2 experts -> [0, 1, 5, 2, 3, 4, 6, 7, 8, 9] (torchtitan's _permute cases).
std::vector<int64_t> expert_major_order(const std::vector<int64_t>& counts, int64_t groups, int64_t experts);
// Each expert's rows in that order: the sums over groups ([3, 7] above).
std::vector<int64_t> rows_per_expert(const std::vector<int64_t>& counts, int64_t groups, int64_t experts);

// How the experts run once a parallelism applied from outside the model has spread them over ranks (expert
// parallelism, dist/expert_parallel.h, installed by dist::apply_expert_parallel). A layer without one runs its
// experts itself: one null check per call.
struct ExpertStyle {
  virtual ~ExpertStyle() = default;
  // rows (M, C): this process's kept slots' rows, expert-major over all E experts, kept[e] of expert e -> each row's
  // expert output, in the same order. expert(e, x) runs expert e, one this process holds (MoE::holds).
  virtual Tensor run(const Tensor& rows, const std::vector<int64_t>& kept,
                     const std::function<Tensor(int64_t, const Tensor&)>& expert) const = 0;
};

// Shared by the MoE layers of a model: what the training step sets once per step.
struct MoEContext {
  // The gradient the auxiliary loss of a forward's sequences gets (a scalar on the model's device, f32): the
  // caller's weight of that forward in its objective (a micro-batch's share of the step, times the loss scale);
  // undefined: 1 (loss() of a single forward).
  Tensor aux_weight;
};

class MoE : public Module {
 public:
  MoE(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> dropout,
      std::shared_ptr<const MoEContext> ctx, int64_t block = 0);
  // x: (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) const;

  // The slots sent to each expert (routed) and run by it (kept, after capacity) by the forwards whose backward ran
  // since the last call (then zeroed), as the bias update and the step's report read them; each rank's, before any
  // sum over ranks.
  struct Counts {
    std::vector<double> routed, kept;
  };
  Counts take_counts() const;
  // expert_bias += rate · sign(mean(counts) − counts), centred to mean 0 (counts: summed over the step's ranks).
  void update_bias(const std::vector<double>& counts, double rate);
  // Once per optimizer step, with take_counts() summed over the ranks that train the same model (the data-parallel
  // ones): under bias balancing, update_bias(routed, cfg.moe_bias_rate); returns the step's load.
  struct Load {
    int64_t block = 0;            // the block this layer is the MLP of
    double max_over_mean = 0;     // the busiest expert's slots over the mean (1: balanced)
    double dropped_fraction = 0;  // the slots capacity dropped, over those routed
    double aux_loss = 0;          // last_aux_loss() (0 without)
  };
  Load finish_step(const Counts& summed);
  const GPTConfig& config() const { return cfg_; }
  int64_t block() const { return block_; }  // the block this layer is the MLP of
  // Keeps experts [first, first + count) only, under their global names (moe.experts.<first> ...): a parallelism
  // that holds the others elsewhere (ExpertStyle) calls it. Throws unless the range lies within the held ones.
  void keep_experts(int64_t first, int64_t count);
  // Whether global expert e is held here, and it.
  bool holds(int64_t e) const {
    return e >= experts->first_index() && e < experts->first_index() + int64_t(experts->size());
  }
  const LlamaMLP& expert(int64_t e) const { return (*experts)[size_t(e - experts->first_index())]; }
  // The last forward's routing (tests, TensorBoard's tokens per expert and dropped fraction).
  const Routing& last_routing() const { return *last_; }
  // The last forward's auxiliary loss (a scalar, undefined unless cfg.moe_balance is aux): what its backward adds,
  // at weight 1, to the objective's value (logging, finite differences).
  const Tensor& last_aux_loss() const { return *last_aux_; }
  // The last forward's router logits (N, E), f32 (transformers' router_logits).
  const Tensor& last_router_logits() const { return *last_logits_; }

  std::shared_ptr<Linear> router;                 // (C, E), no bias (HF's block_sparse_moe.gate)
  Tensor expert_bias;                             // (E) f32 buffer: the bias balancing's choice offsets
  std::shared_ptr<ModuleList<LlamaMLP>> experts;  // E SwiGLU MLPs of width cfg.mlp_width() (keep_experts: some)
  std::shared_ptr<LlamaMLP> shared;               // cfg.moe_shared experts as one MLP of that many times the width
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<const ExpertStyle> style;  // null: every expert here, run by this layer

 private:
  GPTConfig cfg_;
  int64_t block_;
  std::shared_ptr<const MoEContext> ctx_;
  std::shared_ptr<Counts> counted_;  // filled in backward (see take_counts)
  std::shared_ptr<Routing> last_;
  std::shared_ptr<Tensor> last_aux_, last_logits_;
};

// The MoE layers of a model (or of the part a GPT holds), in block order.
std::vector<MoE*> moe_layers(const GPT& model);

}  // namespace minidl::nn
