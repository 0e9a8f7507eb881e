#include "nn/llama.h"

#include "nn/moe.h"
#include "ops/cast.h"

namespace minidl::nn {

RotaryTables::RotaryTables(int64_t positions, int64_t head_dim, double theta, const ops::RopeScaling& scaling) {
  MemoryTagGuard tag(MemTag::kOther);  // kept for the model's life
  cpu_ = ops::rope_tables(positions, head_dim, theta, scaling);
  cached_ = cpu_;
}

const ops::RopeTables& RotaryTables::on(Device device, DType dtype) const {
  const DType want = dtype == DType::f64 ? DType::f64 : DType::f32;
  if (cached_.cos.device() != device || cached_.cos.dtype() != want) {
    MemoryTagGuard tag(MemTag::kOther);
    cached_.cos = ops::cast(cpu_.cos, want).to(device);
    cached_.sin = ops::cast(cpu_.sin, want).to(device);
  }
  return cached_;
}

LlamaAttention::LlamaAttention(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx,
                               std::shared_ptr<const RotaryTables> rope)
    : head_dim(cfg.head_size()), rope_(std::move(rope)) {
  const int64_t C = cfg.n_embd, D = cfg.head_size();
  q_proj = register_module("q_proj", std::make_shared<Linear>(C, cfg.n_head * D, false));
  k_proj = register_module("k_proj", std::make_shared<Linear>(C, cfg.kv_heads() * D, false));
  v_proj = register_module("v_proj", std::make_shared<Linear>(C, cfg.kv_heads() * D, false));
  c_proj = register_module("c_proj", std::make_shared<Linear>(cfg.n_head * D, C, false));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor LlamaAttention::qkv(const Tensor& x, int64_t offset) const {
  const Tensor q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);
  const int64_t B = q.size(0), T = q.size(1), H = heads(), Hkv = kv_heads(), D = head_dim;
  const ops::RopeTables& t = rope_->on(q.device(), q.dtype());
  auto turn = [&](const Tensor& a, int64_t heads, int64_t at) {
    const int64_t n = a.size(1);
    return rope(a.reshape({B, n, heads, D}), t.cos, t.sin, at).view({B, n, heads * D});
  };
  if (!style || offset != 0) return cat({turn(q, H, offset), turn(k, Hkv, offset), v}, 2);
  // A split sequence (context parallelism): each run of this process's positions is turned at its global start.
  const std::vector<PositionRun> runs = style->runs(T);
  MINIDL_CHECK(runs.size() == 1 || runs.size() == 2, "LlamaAttention: expected 1 or 2 position runs, got ",
               runs.size());
  auto turned = [&](const Tensor& a, int64_t heads) {
    const PositionRun &r0 = runs[0], &r1 = runs.back();
    if (runs.size() == 1) return turn(a, heads, r0.global);
    return cat({turn(a.narrow(1, r0.local, r0.length), heads, r0.global),
                turn(a.narrow(1, r1.local, r1.length), heads, r1.global)},
               1);
  };
  return cat({turned(q, H), turned(k, Hkv), v}, 2);
}

Tensor LlamaAttention::forward(const Tensor& x) const {
  const int h = int(heads()), hkv = int(kv_heads());
  const Tensor packed = qkv(x, 0);
  const Tensor y = style ? style->attend(packed, h, hkv) : causal_attention(packed, h, hkv);
  return resid_dropout->forward(c_proj->forward(y));
}

LlamaMLP::LlamaMLP(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx) {
  const int64_t C = cfg.n_embd, I = cfg.mlp_width();
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(C, I, false));
  up_proj = register_module("up_proj", std::make_shared<Linear>(C, I, false));
  c_proj = register_module("c_proj", std::make_shared<Linear>(I, C, false));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

// gate and up are column-parallel the same way under tensor parallelism, so a rank's columns pair up and SwiGLU,
// elementwise, runs on them alone.
Tensor LlamaMLP::forward(const Tensor& x) const {
  return dropout->forward(c_proj->forward(swiglu(gate_proj->forward(x), up_proj->forward(x))));
}

LlamaBlock::LlamaBlock(const GPTConfig& cfg, int64_t index, uint64_t first_stream,
                       std::shared_ptr<const DropoutContext> ctx, std::shared_ptr<const RotaryTables> rope,
                       std::shared_ptr<const MoEContext> moe_ctx) {
  ln_1 = register_module("ln_1", std::make_shared<RMSNorm>(cfg.n_embd, cfg.norm_eps));
  attn = register_module("attn", std::make_shared<LlamaAttention>(cfg, first_stream, ctx, std::move(rope)));
  ln_2 = register_module("ln_2", std::make_shared<RMSNorm>(cfg.n_embd, cfg.norm_eps));
  if (cfg.moe_layer(index))
    moe = register_module("moe", std::make_shared<MoE>(cfg, first_stream + 1, ctx, std::move(moe_ctx), index));
  else
    mlp = register_module("mlp", std::make_shared<LlamaMLP>(cfg, first_stream + 1, ctx));
}

Tensor LlamaBlock::mlp_branch(const Tensor& x) const {
  const Tensor n = ln_2->forward(x);
  return moe ? moe->forward(n) : mlp->forward(n);
}

std::vector<Tensor> LlamaBlock::attention_parameters() const { return branch_parameters(*ln_1, *attn); }
std::vector<Tensor> LlamaBlock::mlp_parameters() const {
  return moe ? branch_parameters(*ln_2, *moe) : branch_parameters(*ln_2, *mlp);
}

Tensor LlamaBlock::forward_cached(const Tensor& x, BlockKV& kv, int64_t length, int64_t block_size) const {
  const Tensor qkv = attn->qkv(ln_1->forward(x), length);
  const Tensor y = cached_attention(qkv, attn->heads(), attn->kv_heads(), kv, length, block_size);
  const Tensor h = x + attn->resid_dropout->forward(attn->c_proj->forward(y));
  return h + mlp_branch(h);
}

}  // namespace minidl::nn
