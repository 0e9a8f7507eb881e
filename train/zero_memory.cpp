#include "train/zero_memory.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace minidl::train {

namespace {

// A dense block's parameters on one of tp ranks (zero_memory.h, block_params, has the count).
double dense_block_params(const nn::GPTConfig& m, int tp) {
  const double c = double(m.n_embd);
  if (m.llama()) {
    const double hd = double(m.n_head * m.head_size()), kvd = double(m.kv_heads() * m.head_size());
    return (2 * c * hd + 2 * c * kvd + 3 * c * double(m.mlp_width())) / tp + 2 * c;
  }
  return m.bias ? (12 * c * c + 7 * c) / tp + 6 * c : 12 * c * c / tp + 2 * c;
}

// wte (V·C, its rows split over tp ranks, the vocabulary padded to a multiple of tp), wpe (T·C; GPT-2), ln_f (2C,
// or C without bias), an untied lm_head (V·C, split as wte).
double persistent_params(const nn::GPTConfig& m, int tp) {
  const double c = double(m.n_embd), rows = double((m.vocab_size + tp - 1) / tp);
  const double tables = rows * c * (m.tie_embeddings ? 1 : 2);
  return tables + (m.llama() ? 0.0 : double(m.block_size) * c) + (m.bias ? 2 * c : c);
}

}  // namespace

double expert_params(const nn::GPTConfig& m, int64_t block, int ep) {
  if (!m.moe_layer(block)) return 0;
  return double(m.moe_experts / std::max(1, ep)) * 3 * double(m.n_embd) * double(m.mlp_width());
}

double block_params(const nn::GPTConfig& m, int64_t block, int tp, int ep) {
  const double dense = dense_block_params(m, tp);
  if (!m.moe_layer(block)) return dense;
  const double c = double(m.n_embd), mlp = 3 * c * double(m.mlp_width());
  return dense - mlp + c * double(m.moe_experts) + double(m.moe_shared) * mlp + expert_params(m, block, ep);
}

double kv_cache_bytes(const nn::GPTConfig& m, DType dtype) {
  return 2.0 * double(m.n_layer * m.kv_heads() * m.head_size() * m.block_size) * double(dtype_size(dtype));
}

MemoryPlan predict_memory(const MemoryQuery& q) {
  const nn::GPTConfig& m = q.model;
  const int tp = std::max(1, q.tp);
  const double n = q.dp, phi = persistent_params(m, tp);
  double all_blocks = 0, blk = 0;
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const double here = block_params(m, i, tp, q.ep);
    all_blocks += here;
    blk = std::max(blk, here);
  }
  const double psi = phi + all_blocks;
  const bool half = q.amp != DType::f32;
  MemoryPlan p;
  p.persistent = phi;
  p.block = blk;
  p.blocks = all_blocks;
  p.params_rest = q.stage == 3 ? 4 * (psi - phi) / n + 4 * phi : 4 * psi;
  // Without ZeRO the tied table lives in its padded buffer (nn::GPTConfig::vocab_pad; tensor parallelism pads by its
  // own rule, counted in persistent_params): the padding rows are parameter bytes that are no parameter. ZeRO's flat
  // buffers hold the real rows only (the head pads a copy per forward).
  const double padding_rows = tp == 1 ? double(m.padded_vocab() - m.vocab_size) : 0.0;
  if (q.stage == 0) p.params_rest += 4 * padding_rows * double(m.n_embd);
  p.grads_rest = q.stage >= 2 ? 4 * psi / n : 4 * psi;
  p.optimizer = q.stage >= 1 ? 8 * psi / n : 8 * psi;
  if (q.stage == 3) {
    p.params_step = 2 * blk * (half ? 6 : 4) + (half ? 2 * phi : 0);  // two gathered blocks; wte/wpe/ln_f copies
    // The bucket being filled and the one reduce-scattering, and the persistent unit's (filled from the head on).
    p.grads_step = 4 * (blk + phi);
  } else {
    p.params_step = half ? 2 * psi : 0;
    // Stage 2: the buckets between their first gradient and their reduce-scatter; at worst about two blocks'
    // worth plus the persistent parameters' (the tied wte's gradient starts at the head and ends at the embedding).
    p.grads_step = q.stage == 2 ? 4 * (2 * blk + phi) : 0;
  }
  if (q.grad_accum > 1 && q.stage >= 2) p.grads_step = 4 * psi - p.grads_rest + p.grads_step;

  const double tokens = double(q.micro_batch) * double(q.seq > 0 ? q.seq : m.block_size);
  const double act = half ? 2 : 4, c = double(m.n_embd);
  // Per token and block, what the backward keeps: the norms' inputs and outputs (4C, replicated under tp) and the
  // attention and MLP halves' split tensors. GPT-2: qkv and the attention output (4C), the MLP's 4C input and GELU
  // output (8C). Llama: the packed rotated q|k|v and the attention output (2HD + 2KV·D), gate, up and their
  // SwiGLU (3I). An MoE block's MLP half (nn/moe.h, dropless): per token its k gathered rows, their gate, up and
  // SwiGLU, the experts' outputs, the combine's padded copy and the k slots (k·(4C + 3I)), the shared experts'
  // 3·s·I, and in f32 the router's scores (E; its 16-bit input's f32 copy, C, under --amp).
  double attn_split = 4 * c, mlp_split = 8 * c, moe_split = 0;
  if (m.llama()) {
    const double hd = double(m.n_head * m.head_size()), kvd = double(m.kv_heads() * m.head_size()),
                 I = double(m.mlp_width());
    attn_split = 2 * hd + 2 * kvd;
    mlp_split = 3 * I;
    moe_split = double(m.moe_top_k) * (4 * c + 3 * I) + double(m.moe_shared) * 3 * I +
                (4 * double(m.moe_experts) + (half ? 4 * c : 0)) / act;
  }
  // The part of a block's activations one of tp ranks keeps (see MemoryQuery::tp), and of what lies between the
  // parallel layers (the residual stream, the norms): all of it, or 1/tp under sequence parallelism.
  const bool sp = q.sequence_parallel && tp > 1;
  const double stream = sp ? 1.0 / tp : 1.0, input = stream * c * act * tokens;
  struct Kept {
    double full, attn_half, mlp_half, one_c;  // one_c: C values a token (ln_2's output, kept for the MLP)
  };
  const auto kept = [&](double mlp) {
    const double whole = 4 * c + attn_split + mlp;
    const double share = sp ? 1.0 / tp : (4 * c + (attn_split + mlp) / tp) / whole;
    return Kept{share * whole * act * tokens, (2 * c + attn_split) * share * act * tokens,
                (2 * c + mlp) * share * act * tokens, share * c * act * tokens};
  };
  double blocks = 0, full_max = 0, mlp_max = 0;
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const Kept k = kept(m.moe_layer(i) ? moe_split : mlp_split);
    full_max = std::max(full_max, k.full);
    mlp_max = std::max(mlp_max, k.mlp_half);
    switch (q.recompute) {
      case nn::Recompute::kNone: blocks += k.full; break;
      case nn::Recompute::kBlock: blocks += input; break;
      case nn::Recompute::kAttn: blocks += k.mlp_half + input; break;
      case nn::Recompute::kMlp: blocks += k.attn_half + k.one_c + input; break;
    }
  }
  // The one block recomputed at a time holds its whole set (block) or its recomputed half.
  if (q.recompute == nn::Recompute::kBlock) blocks += full_max;
  if (q.recompute == nn::Recompute::kAttn) blocks += kept(mlp_split).attn_half;
  if (q.recompute == nn::Recompute::kMlp) blocks += mlp_max;
  // The head: ln_f input and output, then the logits: at tp 1 the padded row in the activation dtype, read as is by
  // the classifier, whose gradient is written over it; with tp, f32 logits and their gradient (this rank's slice).
  const double logits = tp == 1 ? act * double(m.padded_vocab()) : 2 * 4 * double((m.vocab_size + tp - 1) / tp);
  p.activations = blocks + tokens * (stream * 2 * c * act + logits);
  return p;
}

double comm_elements_per_step(const MemoryQuery& q) {
  const MemoryPlan p = predict_memory(q);
  const double n = q.dp, psi = p.persistent + p.blocks, f = (n - 1) / n;
  if (q.stage < 3) return 2 * f * psi;
  return f * (2 * double(q.grad_accum) * (psi - p.persistent) + (psi - p.persistent) + 2 * p.persistent);
}

std::string memory_plan(const nn::GPTConfig& model, int dp, DType amp, int64_t global_batch, double budget_bytes) {
  struct Row {
    int stage;
    nn::Recompute rc;
    int64_t micro;
    double peak, comm, recompute_cost;
  };
  auto recompute_cost = [](nn::Recompute r) {  // extra forward work per block, in sixths of a block's forward
    switch (r) {
      case nn::Recompute::kNone: return 0.0;
      case nn::Recompute::kAttn: return 2.0;  // ln_1 + attention: 4C² of the block's 12C² multiply-adds
      case nn::Recompute::kMlp: return 4.0;   // ln_2 + MLP: 8C²
      case nn::Recompute::kBlock: return 6.0;
    }
    return 0.0;
  };
  std::vector<Row> rows;
  const int64_t per_rank = std::max<int64_t>(1, global_batch / dp);
  for (int stage = 0; stage <= 3; ++stage)
    for (nn::Recompute rc : {nn::Recompute::kNone, nn::Recompute::kAttn, nn::Recompute::kMlp, nn::Recompute::kBlock})
      for (int64_t micro = 1; micro <= per_rank; micro *= 2) {
        if (per_rank % micro != 0) continue;
        MemoryQuery q{model, stage, dp, amp, rc, micro, model.block_size, per_rank / micro};
        const double peak = predict_memory(q).peak();
        if (peak <= budget_bytes)
          rows.push_back({stage, rc, micro, peak, comm_elements_per_step(q), recompute_cost(rc)});
      }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.comm != b.comm) return a.comm < b.comm;
    if (a.recompute_cost != b.recompute_cost) return a.recompute_cost < b.recompute_cost;
    if (a.micro != b.micro) return a.micro > b.micro;
    return a.stage < b.stage;
  });
  char line[256];
  std::snprintf(line, sizeof line, "# plan for %.3f GiB per rank, dp %d, %s, global batch %lld, seq %lld\n",
                budget_bytes / double(1ull << 30), dp, amp == DType::f32 ? "f32" : dtype_name(amp),
                (long long)global_batch, (long long)model.block_size);
  std::string out = line;
  if (rows.empty()) return out + "nothing fits: even ZeRO-3 with --recompute block and micro-batch 1 needs more\n";
  out += "zero  recompute  micro_batch  grad_accum  peak_MiB  comm_Melems_per_step\n";
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%4d  %9s  %11lld  %10lld  %8.3f  %20.3f\n", r.stage, nn::recompute_name(r.rc),
                  (long long)r.micro, (long long)(per_rank / r.micro), r.peak / double(1 << 20), r.comm / 1e6);
    out += line;
  }
  return out;
}

}  // namespace minidl::train
