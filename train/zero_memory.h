// The memory a GPT training run needs per rank under ZeRO stage 0-3, from the model configuration alone: the
// arithmetic of dist/zero.h and dist/zero3.h as a function, which the trainer prints beside the ledger after the
// first step, bench/zero_memory tabulates, and --plan-memory searches.
//
//   train::MemoryPlan p = train::predict_memory({cfg, .stage = 3, .dp = 4, .micro_batch = 8});
//   p.params_rest + p.grads_rest + p.optimizer   // bytes held between steps
//   p.peak()                                     // plus what one step adds at its worst moment
//
// Ψ parameters (f32) on this rank (with --tp: its slices and the replicated ones), Φ of them persistent under stage 3
// (wte, wpe or lm_head, ln_f: outside the blocks), N dp ranks, AdamW (m and v, 8 bytes per parameter), per rank:
//                 parameters            gradients      optimizer    added during a step
//   stage 0 (DDP) 4Ψ                    4Ψ             8Ψ           the 16-bit copies (2Ψ, --amp)
//   stage 1       4Ψ                    4Ψ             8Ψ/N         the 16-bit copies (2Ψ, --amp)
//   stage 2       4Ψ                    4Ψ/N           8Ψ/N         16-bit copies; the gradient buckets in flight
//   stage 3       4(Ψ−Φ)/N + 4Φ         4Ψ/N           8Ψ/N         two gathered blocks (4B or 6B per element
//                                                                   with --amp); the buckets in flight
// With --grad-accum k > 1 stages 2 and 3 hold full gradients (4Ψ) during the accumulating micro-batches (the
// policy that keeps DDP's summation order, dist/zero.h). Padding (< N elements per bucket) is left out; the
// vocabulary's padding (nn::GPTConfig::vocab_pad, at tp 1: (Vp − V)·C) is in the parameters of stage 0.
//
// Activations are an estimate, not the ledger's law: per block and token, the tensors minidl's backward keeps
// (ln_1 input and output, qkv, attention output and its log-sum-exp, ln_2 input and output, the MLP's 4C input
// and GELU output: 16·C values; a Llama's packed rotated q|k|v, gate, up and SwiGLU output in their place) in the
// activation dtype (4 bytes, 2 under --amp); with --recompute block only the block's input (C values) plus one block's
// full set during its recomputation; attn and mlp recompute their half. The head keeps ln_f's input and output and the
// logits: 2C values + Vp (the padded vocabulary) in the activation dtype per token, the classifier writing their
// gradient over them; with --tp, 2·V/tp f32 values (the logits and their gradient).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "nn/gpt.h"

namespace minidl::train {

// The KV cache a generation keeps (nn::KVCache, allocated whole at its first call): keys and values of n_kv_head
// heads of head_dim for block_size positions in each block, 2 · n_layer · n_kv_head · head_dim · block_size elements
// of `dtype`: a grouped-query model's is n_kv_head / n_head of multi-head attention's.
double kv_cache_bytes(const nn::GPTConfig& model, DType dtype);

struct MemoryQuery {
  nn::GPTConfig model;
  int stage = 0;           // ZeRO stage, 0 = DDP
  int dp = 1;              // data-parallel ranks
  DType amp = DType::f32;  // bf16 / f16: 16-bit activations and weight copies
  nn::Recompute recompute = nn::Recompute::kNone;
  int64_t micro_batch = 1;  // sequences per rank per micro-batch
  int64_t seq = 0;          // tokens per sequence; 0: model.block_size
  int64_t grad_accum = 1;
  // Tensor parallelism (dist/tp_plan.h): a block's matrices and column-parallel biases and the (padded) vocabulary
  // are split over tp ranks, LayerNorms, wpe and row-parallel biases replicated; activations are the replicated
  // LayerNorm inputs and outputs (4C per token and block) plus 1/tp of the rest (12C), all of them 1/tp with
  // sequence parallelism; the head's logits are 1/tp.
  int tp = 1;
  bool sequence_parallel = false;
  // Expert parallelism (dist/expert_parallel.h): each MoE block holds E / ep of its experts.
  int ep = 1;
};

// Parameters of block `block` on one of tp ranks (of ep, for an MoE block's experts). GPT-2: ln_1, ln_2 (2C each
// with bias, replicated), c_attn (C·3C + 3C), attn.c_proj (C² + C, its bias replicated), c_fc (C·4C + 4C),
// mlp.c_proj (4C·C + C, its bias replicated) = (12C² + 7C) / tp + 6C, at tp 1 12C² + 13C; without biases
// 12C² / tp + 2C (the LayerNorm weights). Llama (H query heads, KV key/value heads of D, SwiGLU width I): q and o
// C·HD each, k and v C·KV·D each, gate, up and down C·I each, all split, and the two RMSNorms (C each, replicated):
// (2C·HD + 2C·KV·D + 3C·I) / tp + 2C. An MoE block (nn/moe.h; block % moe_every == 0) replaces the MLP's 3C·I by
// the router's C·E, the shared experts' s·3C·I and its E / ep experts' 3C·I each (expert_bias is a buffer).
double block_params(const nn::GPTConfig& model, int64_t block, int tp = 1, int ep = 1);
// The experts' part of it: (E / ep)·3C·I in an MoE block, 0 elsewhere.
double expert_params(const nn::GPTConfig& model, int64_t block, int ep = 1);

// Bytes per rank.
struct MemoryPlan {
  double params_rest = 0, grads_rest = 0, optimizer = 0;  // held between steps
  double params_step = 0;  // added to the parameters during a step (16-bit copies, gathered blocks)
  double grads_step = 0;   // added to the gradients during a step (buckets in flight; full gradients under accum)
  double activations = 0;  // estimate of the activation peak of one micro-batch
  // Φ, the largest block's parameters and all blocks', in elements (the blocks differ when some are MoE).
  double persistent = 0, block = 0, blocks = 0;
  double peak() const { return params_rest + grads_rest + optimizer + params_step + grads_step + activations; }
};

MemoryPlan predict_memory(const MemoryQuery& q);

// Elements per rank sent by one optimizer step's collectives over a ring: DDP 2(N−1)/N·Ψ, stages 1-2 the same,
// stage 3 3(N−1)/N·(Ψ−Φ) + 2(N−1)/N·Φ (times k for the block gathers under accumulation).
double comm_elements_per_step(const MemoryQuery& q);

// --plan-memory: every combination of ZeRO stage (0-3), --recompute (none, attn, mlp, block) and micro-batch
// (the powers of two up to global_batch / dp) whose predicted peak fits budget_bytes per rank, cheapest first:
// by communication per step (DDP = stages 1-2 < stage 3; stage 3's gathers grow with the micro-batches), then by
// recomputation (none < attn, mlp < block: extra forward FLOPs), then the larger micro-batch. One row per line, a
// header first; a line saying nothing fits when nothing does.
std::string memory_plan(const nn::GPTConfig& model, int dp, DType amp, int64_t global_batch, double budget_bytes);

}  // namespace minidl::train
