#include "predict/compute.h"

#include <algorithm>

#include "nn/moe.h"
#include "train/zero_memory.h"

namespace minidl::predict {

namespace {

struct Dims {
  double BT, T, C, Vp, tp, s, f = 4, stream;  // stream: the share of the residual stream a rank holds
  // Llama (nn/llama.h): the query heads' width H·D, the key/value heads' KV·D, SwiGLU's width I; GPT-2: 0.
  double HD = 0, KVD = 0, I = 0;
};

Dims dims(const ComputeQuery& q) {
  const double T = double(q.seq > 0 ? q.seq : q.model.block_size), tp = std::max(1, q.tp);
  // The head's rows: the padded vocabulary at tp 1, rounded up to a multiple of tp otherwise (dist/tensor_parallel.h,
  // VocabParallel).
  const double vp = q.tp > 1 ? double((q.model.vocab_size + q.tp - 1) / q.tp * q.tp) : double(q.model.padded_vocab());
  // BT: the rank's tokens (T / cp positions of each of b sequences); T: the keys each query attends to.
  return {double(q.micro_batch) * T / std::max(1, q.cp),
          T,
          double(q.model.n_embd),
          vp,
          tp,
          q.amp == DType::f32 ? 4.0 : 2.0,
          4.0,
          q.sequence_parallel && q.tp > 1 ? 1.0 / tp : 1.0,
          q.model.llama() ? double(q.model.n_head * q.model.head_size()) : 0.0,
          q.model.llama() ? double(q.model.kv_heads() * q.model.head_size()) : 0.0,
          q.model.llama() ? double(q.model.mlp_width()) : 0.0};
}

bool moe(const ComputeQuery& q) { return q.moe_block && q.model.moe(); }

OpCost gemm(std::string name, double m, double k, double n, double s) {
  return {std::move(name), OpClass::kGemm, 2 * m * k * n, s * (m * k + k * n + m * n)};
}

// The block's forward, split into its two halves (what --recompute attn and mlp re-run).
std::vector<OpCost> attn_half(const Dims& d) {
  if (d.HD > 0) {  // Llama: RMSNorm, three projections, RoPE on q and k and their packing, attention over H·D
    const double qkv = (d.HD + 2 * d.KVD) / d.tp;
    return {{"rmsnorm + residual (attn)", OpClass::kElementwise, 0, d.stream * d.BT * d.C * (d.f + d.s + 3 * d.f)},
            gemm("q, k, v", d.BT, d.C, qkv, d.s),
            {"rope + pack q|k|v", OpClass::kElementwise, 0, d.s * d.BT * (4 * (d.HD + d.KVD) + 2 * qkv * d.tp) / d.tp},
            {"attention", OpClass::kAttention, 4 * d.BT * d.T * d.HD / d.tp, d.s * d.BT * (qkv + d.HD / d.tp)},
            gemm("attn proj", d.BT, d.HD / d.tp, d.C, d.s)};
  }
  return {{"layernorm + residual (attn)", OpClass::kElementwise, 0, d.stream * d.BT * d.C * (d.f + d.s + 3 * d.f)},
          gemm("qkv", d.BT, d.C, 3 * d.C / d.tp, d.s),
          {"attention", OpClass::kAttention, 4 * d.BT * d.T * d.C / d.tp, d.s * 4 * d.BT * d.C / d.tp},
          gemm("attn proj", d.BT, d.C / d.tp, d.C, d.s)};
}
std::vector<OpCost> mlp_half(const Dims& d) {
  if (d.I > 0)  // Llama: gate and up, SwiGLU, down
    return {{"rmsnorm + residual (mlp)", OpClass::kElementwise, 0, d.stream * d.BT * d.C * (d.f + d.s + 3 * d.f)},
            gemm("gate, up", d.BT, d.C, 2 * d.I / d.tp, d.s),
            {"swiglu", OpClass::kElementwise, 0, d.s * 3 * d.BT * d.I / d.tp},
            gemm("mlp proj", d.BT, d.I / d.tp, d.C, d.s)};
  return {{"layernorm + residual (mlp)", OpClass::kElementwise, 0, d.stream * d.BT * d.C * (d.f + d.s + 3 * d.f)},
          gemm("fc", d.BT, d.C, 4 * d.C / d.tp, d.s),
          {"gelu", OpClass::kElementwise, 0, d.s * 2 * 4 * d.BT * d.C / d.tp},
          gemm("mlp proj", d.BT, 4 * d.C / d.tp, d.C, d.s)};
}

std::vector<OpCost> moe_half(const Dims& d, const ComputeQuery& q) {
  const nn::GPTConfig& m = q.model;
  const double K = double(m.moe_top_k), E = double(m.moe_experts), held = E / std::max(1, q.ep), I = d.I;
  const double R = moe_rows(q), BT = d.BT, C = d.C, s = d.s, SI = double(m.moe_shared) * I;
  std::vector<OpCost> ops{
      {"rmsnorm + residual (mlp)", OpClass::kElementwise, 0, d.stream * BT * C * (d.f + s + 3 * d.f)},
      {"router", OpClass::kGemm, 2 * BT * C * E, 4 * (BT * C + C * E + BT * E), true},
      {"routing", OpClass::kElementwise, 0, (s == 4 ? 0 : BT * C * (s + 4)) + 16 * BT * E + 16 * BT * K},
      {"dispatch", OpClass::kElementwise, 0, 2 * s * R * C},
      {"experts gate, up", OpClass::kGemm, 2 * R * C * 2 * I, s * (R * C + held * C * 2 * I + R * 2 * I)},
      {"experts swiglu", OpClass::kElementwise, 0, 3 * s * R * I},
      {"experts down", OpClass::kGemm, 2 * R * I * C, s * (R * I + held * I * C + R * C)},
      {"combine", OpClass::kElementwise, 0, 4 * s * R * C + 5 * s * BT * K * C + BT * C * (8 + s)}};
  if (q.ep > 1)
    ops.push_back({"expert-major permutation and back", OpClass::kElementwise, 0, 2 * (s == 4 ? 8 : 20) * R * C});
  if (SI > 0) {
    ops.push_back(gemm("shared gate, up", BT, C, 2 * SI, s));
    ops.push_back({"shared swiglu", OpClass::kElementwise, 0, 3 * s * BT * SI});
    ops.push_back(gemm("shared down", BT, SI, C, s));
    ops.push_back({"shared sum", OpClass::kElementwise, 0, 3 * s * BT * C});
  }
  if (m.moe_balance == nn::GPTConfig::Balance::kAux)
    ops.push_back({"auxiliary loss", OpClass::kElementwise, 0, 12 * BT * E});
  return ops;
}

std::vector<OpCost> backward_of(const std::vector<OpCost>& forward) {
  std::vector<OpCost> out;
  for (const OpCost& op : forward) {
    if (op.cls == OpClass::kGemm) {
      out.push_back({op.name + " bwd dx", op.cls, op.flops, op.bytes, op.f32});
      out.push_back({op.name + " bwd dw", op.cls, op.flops, op.bytes, op.f32});
    } else {
      out.push_back({op.name + " bwd", op.cls, 2 * op.flops, 2 * op.bytes, op.f32});
    }
  }
  return out;
}

void append(std::vector<OpCost>& to, const std::vector<OpCost>& from, const std::string& prefix = "") {
  for (const OpCost& op : from) to.push_back({prefix + op.name, op.cls, op.flops, op.bytes, op.f32});
}

}  // namespace

double moe_rows(const ComputeQuery& q) {
  const nn::GPTConfig& m = q.model;
  const double T = double(q.seq > 0 ? q.seq : m.block_size), b = double(q.micro_batch);
  const double slots = b * T * double(m.moe_top_k);
  const int64_t cap = nn::expert_capacity(m.moe_capacity, int64_t(T), m.moe_top_k, m.moe_experts);
  return cap < 0 ? slots : std::min(slots, b * double(m.moe_experts) * double(cap));
}

double op_seconds(const OpCost& op, const Machine& m, DType amp) {
  if (op.cls == OpClass::kElementwise) return op.bytes / (m.mem_bw * m.eff.elementwise);
  const double eff = op.cls == OpClass::kGemm ? m.eff.gemm : m.eff.attention;
  return std::max(op.flops / (m.peak_flops(op.f32 ? DType::f32 : amp) * eff), op.bytes / m.mem_bw);
}

double ops_seconds(const std::vector<OpCost>& ops, const Machine& m, DType amp) {
  double t = 0;
  for (const OpCost& op : ops) t += op_seconds(op, m, amp);
  return t;
}

ClassSeconds& ClassSeconds::operator+=(const ClassSeconds& o) {
  gemm += o.gemm;
  attention += o.attention;
  elementwise += o.elementwise;
  return *this;
}

ClassSeconds class_seconds(const std::vector<OpCost>& ops, const Machine& m, DType amp) {
  ClassSeconds out;
  for (const OpCost& op : ops)
    (op.cls == OpClass::kGemm        ? out.gemm
     : op.cls == OpClass::kAttention ? out.attention
                                     : out.elementwise) += op_seconds(op, m, amp);
  return out;
}

std::vector<OpCost> block_forward_ops(const ComputeQuery& q) {
  const Dims d = dims(q);
  std::vector<OpCost> ops = attn_half(d);
  append(ops, moe(q) ? moe_half(d, q) : mlp_half(d));
  return ops;
}

std::vector<OpCost> block_backward_ops(const ComputeQuery& q) {
  const Dims d = dims(q);
  std::vector<OpCost> ops;
  switch (q.recompute) {
    case nn::Recompute::kNone: break;
    case nn::Recompute::kBlock: append(ops, block_forward_ops(q), "recompute "); break;
    case nn::Recompute::kAttn: append(ops, attn_half(d), "recompute "); break;
    case nn::Recompute::kMlp: append(ops, moe(q) ? moe_half(d, q) : mlp_half(d), "recompute "); break;
  }
  append(ops, backward_of(block_forward_ops(q)));
  return ops;
}

std::vector<OpCost> head_forward_ops(const ComputeQuery& q) {
  const Dims d = dims(q);
  return {{"ln_f", OpClass::kElementwise, 0, d.stream * d.BT * d.C * (d.f + d.s)},
          gemm("lm head", d.BT, d.C, d.Vp / d.tp, d.s),
          {"cross-entropy", OpClass::kElementwise, 0, d.s * d.BT * d.Vp / d.tp}};
}

std::vector<OpCost> head_backward_ops(const ComputeQuery& q) { return backward_of(head_forward_ops(q)); }

std::vector<OpCost> embedding_forward_ops(const ComputeQuery& q) {
  const Dims d = dims(q);
  const double tables = q.model.llama() ? 1 : 3;  // wte rows (GPT-2: and wpe rows, their sum)
  return {{"embedding", OpClass::kElementwise, 0, d.f * tables * d.BT * d.C}};
}

std::vector<OpCost> embedding_backward_ops(const ComputeQuery& q) {
  const Dims d = dims(q);
  const double tables = q.model.llama() ? 2 : 3;  // dy read, a scatter-add per table
  return {{"embedding bwd", OpClass::kElementwise, 0, d.f * tables * d.BT * d.C}};
}

std::vector<OpCost> optimizer_ops(double params, double cast_params, DType amp) {
  std::vector<OpCost> ops{{"adamw + grad norm + zero_grad", OpClass::kElementwise, 0, (28 + 4 + 4) * params}};
  if (amp != DType::f32) ops.push_back({"16-bit weight copies", OpClass::kElementwise, 0, 6 * cast_params});
  return ops;
}

std::vector<OpCost> zero_ops(int stage, double params, double block_params, int micro_batches, DType amp, bool cpu) {
  if (stage == 1) return {{"ZeRO-1 gradient buckets zeroed", OpClass::kElementwise, 0, 4 * params}};
  if (stage != 2 && stage != 3) return {};
  const double first_gradient = cpu && amp == DType::f32 ? 8 : -4;  // a fresh copy, less DDP's add where it has one
  std::vector<OpCost> ops{{"ZeRO-2/3 gradient buckets zero-filled", OpClass::kElementwise, 0, 4 * params},
                          {"ZeRO-2/3 gradients into fresh tensors and the buckets", OpClass::kElementwise, 0,
                           (8 + first_gradient) * params}};
  if (stage == 3 && amp != DType::f32)
    ops.push_back(
        {"ZeRO-3 16-bit casts per gather", OpClass::kElementwise, 0, 6 * (2 * micro_batches - 1) * block_params});
  return ops;
}

double model_flops_per_token(const nn::GPTConfig& m, int64_t seq) {
  const double C = double(m.n_embd), L = double(m.n_layer);
  double block = m.bias ? 12 * C * C + 13 * C : 12 * C * C + 2 * C, width = C;
  if (m.llama()) {  // q and o C·HD, k and v C·KV·D, gate, up and down C·I, two RMSNorms
    const double hd = double(m.n_head * m.head_size()), kvd = double(m.kv_heads() * m.head_size());
    block = 2 * C * hd + 2 * C * kvd + 3 * C * double(m.mlp_width()) + 2 * C;
    width = hd;
  }
  double blocks = L * block;
  if (m.moe()) {  // a token runs the router, the shared experts and k of an MoE block's E experts
    blocks = 0;
    for (int64_t i = 0; i < m.n_layer; ++i)
      blocks +=
          train::block_params(m, i) - train::expert_params(m, i) * (1 - double(m.moe_top_k) / double(m.moe_experts));
  }
  const double params = double(m.vocab_size) * C + blocks + (m.bias ? 2 * C : C);  // the head's table, blocks, ln_f
  return 6 * params + 12 * L * width * double(seq);
}

}  // namespace minidl::predict
