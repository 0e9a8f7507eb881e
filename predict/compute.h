// Compute time of a GPT's pieces on one rank, from FLOPs and bytes per op: a roofline, max(flops / (peak · eff),
// bytes / bandwidth), with one efficiency factor per op class (predict/machine.h). The op list is the one
// bench/roofline.h times for a whole step, per block and for one of tp ranks (bench/ is a program layer: this is its
// per-rank counterpart, which tensor parallelism and pipeline stages need).
//
// For a micro-batch of b sequences of T tokens (BT = b·T), width C, tp ranks, s bytes per activation (2 under
// --amp, else 4), f = 4 (the f32 residual stream), one block on one rank does, forward:
//   qkv        GEMM  2·BT·C·3C/tp FLOPs      s·(BT·C + 3C²/tp + 3BT·C/tp) bytes
//   attention        4·BT·T·C/tp             s·4BT·C/tp  (Q, K, V in, O out; nanoGPT's count, causal not halved)
//   attn proj  GEMM  2·BT·C·C/tp             s·(BT·C/tp + C²/tp + BT·C)
//   fc         GEMM  2·BT·C·4C/tp            s·(BT·C + 4C²/tp + 4BT·C/tp)
//   GELU       elementwise                   s·2·4BT·C/tp
//   mlp proj   GEMM  2·BT·4C·C/tp            s·(4BT·C/tp + 4C²/tp + BT·C)
//   2 layer norms + 2 residual adds          (2·(f + s) + 2·3f)·BT·C, over tp under sequence parallelism
// Backward: every GEMM twice (the input's gradient and the weight's, each the forward's FLOPs and bytes),
// attention twice the forward's FLOPs and bytes (8·BT·T·C/tp), elementwise ops twice their bytes.
// The head (last stage): ln_f, the tied head GEMM 2·BT·C·Vp/tp, cross-entropy over BT·Vp/tp logits; backward two
// GEMMs and the loss's gradient. The embedding (first stage): a gather of BT rows and wpe, its backward a
// scatter-add of as many.
// An MoE block's MLP half (nn/moe.h; R routed rows, moe_rows; E experts, E/ep on this rank, k per token, s shared):
//   router     GEMM  2·BT·C·E in f32          4·(BT·C + C·E + BT·E), plus the input's f32 copy under --amp
//   routing          the scores' softmax or sigmoid, the host's choice and the gates: 16·BT·E + 16·BT·k
//   dispatch         the R rows gathered: 2s·R·C
//   experts    GEMMs 2·R·C·2I and 2·R·I·C    weights of the E/ep held experts; SwiGLU 3s·R·I
//   combine          the experts' rows concatenated and padded (4s·R·C), the k slots gathered, weighted and summed
//                    (5s·BT·k·C), the sum in f32 and rounded (BT·C·(8 + s))
//   ep > 1           the arrived rows permuted expert-major and back (2·2s·R·C; 16-bit through f32: 20·R·C each)
//   shared           a dense SwiGLU MLP of width s·I on every token, and its sum into the output (3s·BT·C)
//   aux loss         the mean probabilities and the counts: 12·BT·E
// The all-to-alls are communication (predict/predict.h).
// Recompute adds the recomputed part's forward to the backward: all of the block (block), ln_1 + qkv + attention +
// attn proj (attn), or ln_2 + fc + GELU + mlp proj (mlp).
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "nn/gpt.h"
#include "predict/machine.h"

namespace minidl::predict {

enum class OpClass { kGemm, kAttention, kElementwise };

struct OpCost {
  std::string name;
  OpClass cls = OpClass::kElementwise;
  double flops = 0, bytes = 0;
  bool f32 = false;  // a product in f32 whatever --amp says (an MoE's router): at the f32 peak
};

struct ComputeQuery {
  nn::GPTConfig model;
  int tp = 1;
  bool sequence_parallel = false;
  DType amp = DType::f32;
  int64_t micro_batch = 1;  // b sequences
  int64_t seq = 0;          // T; 0: model.block_size
  nn::Recompute recompute = nn::Recompute::kNone;
  int cp = 1;  // context parallelism: this rank's T / cp positions, attending to all T keys
  // A mixture of experts (model.moe()): whether this block is an MoE block (model.moe_layer), and the ep ranks
  // its experts are spread over (dist/expert_parallel.h).
  bool moe_block = false;
  int ep = 1;
};

// The routed rows an MoE block's experts run per micro-batch on one rank: the b·T tokens' k slots each, dropless;
// with a capacity factor F, at most ceil(F·T·k/E) per expert and sequence (nn::expert_capacity), the tokens
// spread evenly over the experts (a balanced router's expectation). Under expert parallelism a rank runs E/ep
// experts on the rows of ep ranks: as many rows, balanced.
double moe_rows(const ComputeQuery& q);

// The roofline time of one op on `machine` with products in amp's precision.
double op_seconds(const OpCost& op, const Machine& machine, DType amp);
double ops_seconds(const std::vector<OpCost>& ops, const Machine& machine, DType amp);

// The same time split by op class: where compute goes.
struct ClassSeconds {
  double gemm = 0, attention = 0, elementwise = 0;
  double total() const { return gemm + attention + elementwise; }
  ClassSeconds& operator+=(const ClassSeconds& o);
  ClassSeconds operator*(double k) const { return {gemm * k, attention * k, elementwise * k}; }
};
ClassSeconds class_seconds(const std::vector<OpCost>& ops, const Machine& machine, DType amp);

std::vector<OpCost> block_forward_ops(const ComputeQuery& q);
std::vector<OpCost> block_backward_ops(const ComputeQuery& q);  // recompute's forward included
std::vector<OpCost> head_forward_ops(const ComputeQuery& q);
std::vector<OpCost> head_backward_ops(const ComputeQuery& q);
std::vector<OpCost> embedding_forward_ops(const ComputeQuery& q);
std::vector<OpCost> embedding_backward_ops(const ComputeQuery& q);
// AdamW over `params` f32 parameters (reads p, g, m, v, writes p, m, v: 28 bytes each), the gradient norm (4) and
// the gradients' zeroing (4); with amp, the 16-bit weight copies of `cast_params` parameters (4 read + 2 written).
std::vector<OpCost> optimizer_ops(double params, double cast_params, DType amp);
// What ZeRO stage 1-3 moves in memory per step on one rank beyond what DDP moves for the same step, over the
// rank's Ψ = `params` parameters (f32; `block_params` of them in blocks), M micro-batches; `cpu`: Machine::cpu.
//   stage 1  gather_parameters() zeroes every gradient bucket (the part outside this rank's shard still holds its
//            unreduced gradients; zero_grad() zeroes only the shard, counted in optimizer_ops):        4Ψ written.
//            The gradients land in the buckets as under DDP, and the all-gather writes the parameters in place
//            (they are views of the flat buffer): nothing else.
//   stage 2, 3  the buckets live from their first gradient to their reduce-scatter, and .grad() is dropped with
//            them (ReducerOptions::release_buffers), so every step
//            - allocates each bucket zero-filled (Reducer::allocate):                                   4Ψ written;
//            - copies each gradient into its bucket slot (Reducer::adopt):                          8Ψ (4 + 4);
//            - begins with .grad() undefined: autograd writes the first micro-batch's gradient to a fresh tensor
//              and copies it (AccumulateGrad, 8Ψ) where DDP adds into its bucket. On the CPU in f32 DDP's add is
//              inside the weight GEMM (nothing extra), so the copy counts 8Ψ; elsewhere DDP's add moves 12Ψ,
//              which no layout counts, so the copy counts 8Ψ − 12Ψ = −4Ψ.
//            So 20Ψ on the CPU in f32, 8Ψ elsewhere; the later micro-batches accumulate as DDP's do.
//   stage 3 with amp  each block is cast to 16 bits after each gather, before its forward and its backward in every
//            micro-batch (ZeroStage3::ensure_gathered, 4 read + 2 written), where DDP's autocast casts once a step
//            (optimizer_ops):                                                      6·(2M − 1)·block_params.
// Left out: the flat buffers' padding (< dp elements a bucket), and what the collectives do themselves (the MPI
// backend's division for the average: 8Ψ/dp after ZeRO's reduce-scatter, 8Ψ after DDP's all-reduce).
std::vector<OpCost> zero_ops(int stage, double params, double block_params, int micro_batches, DType amp, bool cpu);

// The model's FLOPs per token, nanoGPT's convention as nn::GPT::flops_per_token: 6 per parameter but wpe's,
// plus 12·L·C·T for attention.
double model_flops_per_token(const nn::GPTConfig& model, int64_t seq);

}  // namespace minidl::predict
