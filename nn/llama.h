// Llama's block (nn::GPT with cfg.arch = kLlama; nn/gpt.h): RMSNorm, rotary positions, grouped-query attention and
// a SwiGLU MLP, without biases. As transformers' LlamaDecoderLayer:
//
//   h   = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))     n = input_layernorm(x)
//   out = h + down_proj(silu(gate_proj(m)) * up_proj(m))                         m = post_attention_layernorm(h)
//
// under minidl's names (nn/checkpoint.h maps them to HF's): ln_1, attn.{q_proj, k_proj, v_proj, c_proj}, ln_2,
// mlp.{gate_proj, up_proj, c_proj}. The residual projections are named c_proj as GPT-2's, so initialisation (depth
// scaled) and the parallelism plans treat them alike. Weights are (in, out) as every minidl Linear.
//
// Attention: q has n_head heads, k and v n_kv_head (GQA; MQA at 1), each head_dim wide; RoPE (rotate_half, f32
// tables of the config's theta and rope_scaling, ops/rope.h) turns q and k, then the packed q|k|v goes to the fused
// causal attention, which maps q head h to key/value head h / (n_head / n_kv_head) without repeating K and V
// (ops/attention.h). The heads are counted from the projections' widths, so a rank holding some of them
// (tensor parallelism: dist/tp_plan.h) runs this code unchanged on its heads.
#pragma once

#include <memory>

#include "nn/gpt.h"

namespace minidl::nn {

// The cos and sin tables of RoPE for a model's positions, built once on the CPU and copied to the device (and
// element type: f64 models) the first time a layer asks there; every layer shares one.
class RotaryTables {
 public:
  RotaryTables(int64_t positions, int64_t head_dim, double theta, const ops::RopeScaling& scaling);
  // The tables on `device` as `dtype` needs them (f32, or f64 for f64 activations). Not thread-safe.
  const ops::RopeTables& on(Device device, DType dtype) const;

 private:
  ops::RopeTables cpu_;
  mutable ops::RopeTables cached_;
};

class LlamaAttention : public Module {
 public:
  LlamaAttention(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx,
                 std::shared_ptr<const RotaryTables> rope);
  // x: (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) const;
  // x: (B, T, C) at positions [offset, offset + T) -> this process's q and k heads rotated and v, packed as the
  // attention reads them: (B, T, (heads + 2 kv_heads) * head_dim).
  Tensor qkv(const Tensor& x, int64_t offset) const;
  // This process's query and key/value heads (the projections' widths over head_dim).
  int64_t heads() const { return q_proj->weight.size(1) / head_dim; }
  int64_t kv_heads() const { return k_proj->weight.size(1) / head_dim; }

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, c_proj;
  std::shared_ptr<Dropout> resid_dropout;
  int64_t head_dim;
  std::shared_ptr<const AttentionStyle> style;  // null: as written (nn/gpt.h)

 private:
  std::shared_ptr<const RotaryTables> rope_;
};

// gate_proj, up_proj (C, I) -> silu(gate) * up (fused) -> c_proj (I, C) -> dropout.
class LlamaMLP : public Module {
 public:
  LlamaMLP(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Linear> gate_proj, up_proj, c_proj;
  std::shared_ptr<Dropout> dropout;
};

class MoE;
struct MoEContext;

// With cfg.moe_layer(index), the MLP is a mixture of experts (nn/moe.h), registered as "moe" (mlp is then null).
class LlamaBlock : public TransformerBlock {
 public:
  LlamaBlock(const GPTConfig& cfg, int64_t index, uint64_t first_stream, std::shared_ptr<const DropoutContext> ctx,
             std::shared_ptr<const RotaryTables> rope, std::shared_ptr<const MoEContext> moe_ctx = nullptr);
  Tensor attention_branch(const Tensor& x) const override { return attn->forward(ln_1->forward(x)); }
  Tensor mlp_branch(const Tensor& x) const override;
  std::vector<Tensor> attention_parameters() const override;
  std::vector<Tensor> mlp_parameters() const override;
  Tensor forward_cached(const Tensor& x, BlockKV& kv, int64_t length, int64_t block_size) const override;

  std::shared_ptr<RMSNorm> ln_1, ln_2;
  std::shared_ptr<LlamaAttention> attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<MoE> moe;
};

}  // namespace minidl::nn
