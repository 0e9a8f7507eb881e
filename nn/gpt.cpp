#include "nn/gpt.h"

#include <cmath>
#include <type_traits>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/upload.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "nn/llama.h"
#include "nn/moe.h"
#include "nn/param_layout.h"

namespace minidl::nn {

void GPTConfig::validate() const {
  MINIDL_CHECK(vocab_size > 0, "GPTConfig: expected vocab_size > 0, got ", vocab_size);
  MINIDL_CHECK(block_size > 0, "GPTConfig: expected block_size > 0, got ", block_size);
  MINIDL_CHECK(n_layer > 0, "GPTConfig: expected n_layer > 0, got ", n_layer);
  MINIDL_CHECK(n_head > 0, "GPTConfig: expected n_head > 0, got ", n_head);
  MINIDL_CHECK(n_embd > 0 && (head_dim > 0 || n_embd % n_head == 0), "GPTConfig: n_embd must be a positive multiple ",
               "of n_head (", n_head, ") unless head_dim is given, got n_embd = ", n_embd);
  MINIDL_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: expected 0 <= dropout < 1, got ", dropout);
  MINIDL_CHECK(vocab_pad >= 1, "GPTConfig: expected vocab_pad >= 1 (1: no padding), got ", vocab_pad);
  MINIDL_CHECK(n_kv_head >= 0 && head_dim >= 0 && intermediate_size >= 0,
               "GPTConfig: expected n_kv_head, head_dim and intermediate_size >= 0 (0: the default), got ", n_kv_head,
               ", ", head_dim, ", ", intermediate_size);
  MINIDL_CHECK(moe_experts >= 0, "GPTConfig: expected moe_experts >= 0 (0: dense), got ", moe_experts);
  if (moe()) {
    MINIDL_CHECK(llama(), "GPTConfig: a mixture of experts needs arch llama (its SwiGLU experts)");
    MINIDL_CHECK(moe_top_k >= 1 && moe_top_k <= moe_experts, "GPTConfig: expected 1 <= moe_top_k <= moe_experts (",
                 moe_experts, "), got ", moe_top_k);
    MINIDL_CHECK(moe_every >= 1, "GPTConfig: expected moe_every >= 1, got ", moe_every);
    MINIDL_CHECK(moe_shared >= 0, "GPTConfig: expected moe_shared >= 0, got ", moe_shared);
    MINIDL_CHECK(moe_capacity >= 0 && std::isfinite(moe_capacity),
                 "GPTConfig: expected a capacity factor > 0, or 0 (dropless), got ", moe_capacity);
    MINIDL_CHECK(moe_aux_coef >= 0 && moe_bias_rate >= 0,
                 "GPTConfig: expected moe_aux_coef and moe_bias_rate >= 0, got ", moe_aux_coef, " and ", moe_bias_rate);
  }
  if (!llama()) {
    MINIDL_CHECK(
        kv_heads() == n_head && head_size() * n_head == n_embd && mlp_width() == 4 * n_embd && tie_embeddings &&
            rope_scaling.type == ops::RopeType::kNone,
        "GPTConfig: GPT-2 has n_kv_head = n_head, head_dim = n_embd / n_head, intermediate_size = 4 * n_embd, ",
        "a tied head and no rope_scaling; grouped-query attention, an explicit head_dim or an untied head need ",
        "arch llama");
    return;
  }
  MINIDL_CHECK(n_head % kv_heads() == 0, "GPTConfig: num_attention_heads (", n_head,
               ") must be a multiple of num_key_value_heads (", kv_heads(), ")");
  MINIDL_CHECK(head_size() % 2 == 0, "GPTConfig: RoPE needs an even head_dim, got ", head_size());
  MINIDL_CHECK(!bias, "GPTConfig: Llama has no biases (bias must be false)");
  MINIDL_CHECK(norm_eps > 0 && rope_theta > 0, "GPTConfig: expected norm_eps > 0 and rope_theta > 0, got ", norm_eps,
               " and ", rope_theta);
}

bool GPTConfig::operator==(const GPTConfig& o) const {
  const ops::RopeScaling &a = rope_scaling, &b = o.rope_scaling;
  return vocab_size == o.vocab_size && block_size == o.block_size && n_layer == o.n_layer && n_head == o.n_head &&
         n_embd == o.n_embd && dropout == o.dropout && bias == o.bias && arch == o.arch && kv_heads() == o.kv_heads() &&
         head_size() == o.head_size() && mlp_width() == o.mlp_width() && norm_eps == o.norm_eps &&
         rope_theta == o.rope_theta && tie_embeddings == o.tie_embeddings && a.type == b.type && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings && moe_experts == o.moe_experts &&
         (!moe() || (moe_top_k == o.moe_top_k && moe_every == o.moe_every && moe_shared == o.moe_shared &&
                     moe_router == o.moe_router && moe_balance == o.moe_balance && moe_aux_coef == o.moe_aux_coef &&
                     moe_bias_rate == o.moe_bias_rate && moe_capacity == o.moe_capacity));
}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, uint64_t dropout_stream,
                                         std::shared_ptr<const DropoutContext> ctx)
    : n_head(cfg.n_head), head_dim(cfg.n_embd / cfg.n_head) {
  c_attn = register_module("c_attn", std::make_shared<Linear>(cfg.n_embd, 3 * cfg.n_embd, cfg.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(cfg.n_embd, cfg.n_embd, cfg.bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  const Tensor qkv = c_attn->forward(x);
  const int h = heads(qkv);
  Tensor y = style ? style->attend(qkv, h, h) : causal_attention(qkv, h);
  return resid_dropout->forward(c_proj->forward(y));
}

MLP::MLP(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * cfg.n_embd, cfg.n_embd, cfg.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor MLP::forward(const Tensor& x) const {
  // On a CUDA device c_fc's GEMM, its bias and the GELU are one GEMM with the GELU in its epilogue, and so is the
  // backward's GELU gradient with c_fc's bias gradient (cuBLASLt; autograd/functions/mlp.cpp).
  // (Not when a parallelism computes the two layers its own way: their styles then run, as on the CPU.)
  if (x.device().is_cuda() && !c_fc->style && !c_proj->style)
    return dropout->forward(gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias));
  // The bias is added inside the fused GELU kernel: one pass over the (B, T, 4C) activation instead of two. GELU is
  // elementwise, so it runs on a column-parallel rank's columns alone.
  Tensor pre = c_fc->product(x);
  Tensor h = c_fc->bias.defined() ? bias_gelu(pre, c_fc->bias) : gelu(pre);
  return dropout->forward(c_proj->forward(h));
}

Block::Block(const GPTConfig& cfg, uint64_t first_stream, std::shared_ptr<const DropoutContext> ctx) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, first_stream, ctx));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(cfg, first_stream + 1, ctx));
}

Tensor Block::after_attention(const Tensor& x, const Tensor& a) const {
  const AddLayerNorm y = ln_2->forward_add(x, a);
  return y.sum + mlp->forward(y.y);
}

std::vector<Tensor> Block::attention_parameters() const { return branch_parameters(*ln_1, *attn); }
std::vector<Tensor> Block::mlp_parameters() const { return branch_parameters(*ln_2, *mlp); }

Tensor cached_attention(const Tensor& qkv, int64_t H, int64_t Hkv, BlockKV& kv, int64_t length, int64_t block_size) {
  MINIDL_CHECK(
      qkv.dim() == 3 && qkv.size(0) == 1 && H >= 1 && Hkv >= 1 && H % Hkv == 0 && qkv.size(2) % (H + 2 * Hkv) == 0,
      "cached_attention: expected qkv of shape (1, t, (heads + 2 * kv_heads) * head_dim) with heads = ", H,
      " a multiple of kv_heads = ", Hkv, ", got ", qkv.shape());
  const int64_t t = qkv.size(1), D = qkv.size(2) / (H + 2 * Hkv), group = H / Hkv;
  MINIDL_CHECK((length == 0 || t == 1) && length + t <= block_size, "cached_attention: expected one new position ",
               "after the first call and at most block_size = ", block_size, " positions in all, got ", t, " after ",
               length);
  // Columns [first * D, (first + n) * D) of (1, t, .) -> (n, t, D)
  auto heads = [&](int64_t first, int64_t n) {
    return qkv.narrow(2, first * D, n * D).reshape({t, n, D}).transpose(0, 1).contiguous();
  };
  if (!kv.k_t.defined()) {
    MemoryTagGuard tag(MemTag::kActivations);
    kv.k_t = Tensor::empty({Hkv, D, block_size}, qkv.dtype(), qkv.device());
    kv.v = Tensor::empty({Hkv, block_size, D}, qkv.dtype(), qkv.device());
  }
  kv.k_t.narrow(2, length, t).copy_(heads(H, Hkv).transpose(1, 2));
  kv.v.narrow(1, length, t).copy_(heads(H + Hkv, Hkv));
  if (length == 0) return causal_attention(qkv, int(H), int(Hkv));  // the uncached forward's own attention
  // Views of the kept columns and rows: the products read them in place (one stride per head). The group's query
  // heads (g consecutive ones share a kv head) are the rows of one product with their kv head's keys.
  const Tensor keys_t = kv.k_t.narrow(2, 0, length + 1), values = kv.v.narrow(1, 0, length + 1);
  const Tensor q = heads(0, H).reshape({Hkv, group, D});
  const Tensor p = softmax(mul(matmul(q, keys_t), 1.0 / std::sqrt(double(D))));  // (Hkv, group, L + 1)
  return matmul(p, values).reshape({H, 1, D}).transpose(0, 1).contiguous().reshape({1, 1, H * D});
}

Tensor Block::forward_cached(const Tensor& x, BlockKV& kv, int64_t length, int64_t block_size) const {
  const Tensor qkv = attn->c_attn->forward(ln_1->forward(x));
  const int64_t H = attn->heads(qkv);
  const Tensor y = cached_attention(qkv, H, H, kv, length, block_size);
  const AddLayerNorm sum = ln_2->forward_add(x, attn->resid_dropout->forward(attn->c_proj->forward(y)));
  return sum.sum + mlp->forward(sum.y);
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed) : GPT(cfg, seed, GPTStage{}) {}

GPT::GPT(const GPTConfig& cfg, uint64_t seed, GPTStage stage)
    : cfg_(cfg),
      stage_(stage),
      dropout_ctx_(std::make_shared<DropoutContext>()),
      moe_ctx_(std::make_shared<MoEContext>()) {
  cfg.validate();
  if (stage_.last_block == -1) stage_.last_block = cfg.n_layer;
  MINIDL_CHECK(0 <= stage_.first_block && stage_.first_block <= stage_.last_block && stage_.last_block <= cfg.n_layer,
               "GPT: expected a stage's blocks [first_block, last_block) inside [0, n_layer = ", cfg.n_layer,
               "], got [", stage.first_block, ", ", stage.last_block, ")");
  dropout_ctx_->seed = seed;
  const SkipDefaultInit skip;  // init_weights below sets every parameter (biases stay zero, as GPT-2's)
  const uint64_t base = DropoutContext::kDropoutStreamBase;
  // HF nests everything but the (tied) head under "transformer".
  auto transformer = register_module("transformer", std::make_shared<Module>());
  if (stage_.embedding || (stage_.head && cfg.tie_embeddings))
    wte = transformer->register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd));
  if (stage_.embedding) {
    if (!cfg.llama())
      wpe = transformer->register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd));
    drop = transformer->register_module("drop", std::make_shared<Dropout>(cfg.dropout, base, dropout_ctx_));
  }
  // Blocks are named, and draw dropout streams, by their global index.
  h = transformer->register_module("h", std::make_shared<ModuleList<TransformerBlock>>(stage_.first_block));
  std::shared_ptr<const RotaryTables> rope;
  if (cfg.llama() && stage_.last_block > stage_.first_block)
    rope = std::make_shared<RotaryTables>(cfg.block_size, cfg.head_size(), cfg.rope_theta, cfg.rope_scaling);
  for (int64_t i = stage_.first_block; i < stage_.last_block; ++i) {
    const uint64_t stream = base + 1 + 2 * uint64_t(i);
    if (cfg.llama())
      h->push_back(std::make_shared<LlamaBlock>(cfg, i, stream, dropout_ctx_, rope, moe_ctx_));
    else
      h->push_back(std::make_shared<Block>(cfg, stream, dropout_ctx_));
  }
  if (stage_.head) {
    if (cfg.llama())
      ln_f = transformer->register_module("ln_f", std::make_shared<RMSNorm>(cfg.n_embd, cfg.norm_eps));
    else
      ln_f = transformer->register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
    if (!cfg.tie_embeddings)
      lm_head = register_module("lm_head", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd));
  }
  init_weights(seed);
  if (stage_.head) padded_head_weight();  // moves wte's weight into its padded buffer now, not in the first step
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

static bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Index of `name` in `params`' names.
static int64_t position(const NamedTensors& params, const std::string& name) {
  for (size_t j = 0; j < params.size(); ++j)
    if (params[j].first == name) return int64_t(j);
  MINIDL_ASSERT(false, "GPT: no parameter named ", name);
  return -1;
}

int64_t GPT::global_parameter_index(const std::string& name) const {
  // The whole model's order: transformer.wte.weight, transformer.wpe.weight (GPT-2), then each block's parameters
  // (GPT-2: 6 weights, and 6 biases with cfg.bias: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj;
  // Llama: ln_1, attn.{q,k,v}_proj, attn.c_proj, ln_2, mlp.{gate,up}_proj, mlp.c_proj; an MoE block: ln_1, the
  // attention's 4, ln_2, moe.router, 3 per expert, and 3 for the shared expert), then ln_f, then lm_head (untied).
  const int64_t embeddings = cfg_.llama() ? 1 : 2;
  auto per_block = [&](int64_t i) -> int64_t {
    if (!cfg_.llama()) return cfg_.bias ? 12 : 6;
    if (!cfg_.moe_layer(i)) return 9;
    return 7 + 3 * cfg_.moe_experts + (cfg_.moe_shared > 0 ? 3 : 0);
  };
  auto before_block = [&](int64_t i) {
    int64_t n = embeddings;
    for (int64_t j = 0; j < i; ++j) n += per_block(j);
    return n;
  };
  const int64_t ln_f_params = cfg_.llama() || !cfg_.bias ? 1 : 2;
  if (name == "transformer.wte.weight") return 0;
  if (name == "transformer.wpe.weight") return 1;
  if (name == "lm_head.weight") return before_block(cfg_.n_layer) + ln_f_params;
  const std::string blocks_prefix = "transformer.h.", ln_f_prefix = "transformer.ln_f.";
  if (starts_with(name, blocks_prefix)) {
    const size_t dot = name.find('.', blocks_prefix.size());
    const int64_t i = std::stoll(name.substr(blocks_prefix.size(), dot - blocks_prefix.size()));
    const TransformerBlock& block = (*h)[size_t(i - stage_.first_block)];
    const NamedTensors own = block.named_parameters();
    MINIDL_ASSERT(int64_t(own.size()) == per_block(i), "GPT: block ", i, " has ", own.size(), " parameters, expected ",
                  per_block(i));
    return before_block(i) + position(own, name.substr(dot + 1));
  }
  MINIDL_ASSERT(starts_with(name, ln_f_prefix), "GPT: unexpected parameter ", name);
  return before_block(cfg_.n_layer) + position(ln_f->named_parameters(), name.substr(ln_f_prefix.size()));
}

void GPT::init_weights(uint64_t seed) {
  // Every 2-D parameter of a GPT is a Linear or Embedding weight; 1-D ones (biases, LayerNorm) keep the 0 / 1
  // their layers were built with. The residual projections add into the residual stream once per block and
  // branch, so they are scaled down to keep its variance independent of depth (GPT-2 paper, section 2.3).
  const double residual_std = 0.02 / std::sqrt(2.0 * double(cfg_.n_layer));
  const bool whole = stage_.first_block == 0 && stage_.last_block == cfg_.n_layer && stage_.embedding && stage_.head;
  NamedTensors params = named_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto& [name, p] = params[k];
    const int64_t stream = global_parameter_index(name);
    MINIDL_ASSERT(!whole || stream == int64_t(k), "GPT: parameter ", name, " is number ", k,
                  " of the whole model but was given global index ", stream);
    if (p.dim() != 2) continue;
    // (and an MoE's experts' and shared expert's: moe.experts.<j>.c_proj, moe.shared.c_proj)
    bool residual = ends_with(name, ".c_proj.weight");
    init_normal(p, residual ? residual_std : 0.02, seed, uint64_t(stream));
  }
}

void GPT::check_ids(const Tensor& ids, const char* what, bool allow_ignore) const {
  MINIDL_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, "GPT: expected ", what,
               " of dtype i32 or i64, got ", ids.dtype());
  if (!ids.device().is_cpu() && ops::indices_checked_on_host()) return;  // loss() checked them before upload
  Tensor c = ids.to(Device::cpu()).contiguous();                         // a device batch is checked on a host copy
  dispatch_dtype(c.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      const T* v = c.data<T>();
      for (int64_t i = 0; i < c.numel(); ++i) {
        bool ok = (v[i] >= 0 && int64_t(v[i]) < cfg_.vocab_size) || (allow_ignore && v[i] == -1);
        MINIDL_CHECK(ok, "GPT: ", what, " must lie in [0, vocab_size = ", cfg_.vocab_size, "), got ", int64_t(v[i]),
                     " at flat index ", i);
      }
    }
  });
}

Tensor GPT::embed(const Tensor& ids) const {
  MINIDL_CHECK(stage_.embedding, "GPT::embed: this stage (blocks [", stage_.first_block, ", ", stage_.last_block,
               ")) does not hold the embedding");
  MINIDL_CHECK(ids.dim() == 2, "GPT::forward: expected ids of shape (B, T), got ", ids.shape());
  const int64_t T = ids.size(1);
  MINIDL_CHECK(T >= 1 && T <= cfg_.block_size,
               "GPT::forward: sequence length must be in [1, block_size = ", cfg_.block_size, "], got T = ", T);
  check_ids(ids, "token ids", false);

  if (!wpe) return drop->forward(wte->forward(ids));  // rotary positions: the blocks' attention turns q and k
  Tensor pos_emb;
  {
    ops::HostCheckedIndicesGuard in_range;  // [0, T) with T <= block_size: no device ids to check
    pos_emb = wpe->forward(position_ids(T, ids.device()));
  }
  Tensor x = wte->forward(ids) + pos_emb;  // (B, T, C) + (T, C), broadcast over the batch
  return drop->forward(x);
}

Tensor GPT::position_ids(int64_t T, Device device) const {
  if (!positions_.defined() || positions_.device() != device) {
    MemoryTagGuard tag(MemTag::kOther);  // kept for the model's life, not one step's activations
    positions_ = Tensor::arange(cfg_.block_size, DType::i64).to(device);
  }
  return positions_.narrow(0, 0, T);
}

Tensor GPT::blocks(int64_t a, int64_t b, const Tensor& x) const {
  MINIDL_CHECK(stage_.first_block <= a && a <= b && b <= stage_.last_block,
               "GPT::blocks: expected a range of blocks "
               "inside this stage's [",
               stage_.first_block, ", ", stage_.last_block, "), got [", a, ", ", b, ")");
  MINIDL_CHECK(x.dim() == 3 && x.size(2) == cfg_.n_embd,
               "GPT::blocks: expected x of shape (B, T, n_embd = ", cfg_.n_embd, "), got ", x.shape());
  Tensor y = x;
  for (int64_t i = a; i < b; ++i) y = run_block(i, y, [&](const Tensor& in) { return forward_block(i, in); });
  return y;
}

Tensor GPT::padded_head_weight() const {
  const Tensor& w = head_table()->weight;
  const int64_t V = cfg_.vocab_size, Vp = cfg_.padded_vocab(), C = cfg_.n_embd;
  if (Vp == V) return w;
  const auto in_padded_buffer = [&] {
    return w.impl()->storage == padded_wte_.lock() && w.impl()->offset == 0 && w.is_contiguous();
  };
  // A weight alone in its storage (a fresh model, or one Module::to moved: no other tensor views that storage) goes
  // (back) into a padded buffer; one that is a view into a shared buffer (a flat buffer of many parameters) stays
  // where its owner put it.
  const bool alone = w.impl()->offset == 0 && w.is_contiguous() && w.impl()->storage.use_count() == 1;
  if (!in_padded_buffer() && alone) {
    MemoryTagGuard tag(MemTag::kParams);
    Tensor padded = Tensor::zeros({Vp, C}, w.dtype(), w.device());
    padded.as_strided({V, C}, {C, 1}, 0).copy_(w.detach());
    Tensor(w.impl_ptr()).set_data(padded.as_strided({V, C}, {C, 1}, 0));
    padded_wte_ = padded.impl()->storage;
  }
  Tensor table;
  if (in_padded_buffer()) {
    table = w.detach().as_strided({Vp, C}, {C, 1}, 0);
  } else {
    table = Tensor::zeros({Vp, C}, w.dtype(), w.device());
    table.as_strided({V, C}, {C, 1}, 0).copy_(w.detach());
  }
  if (!autograd::any_requires_grad({w})) return table;
  return autograd::record("vocab_padding", {w}, table,
                          [V](const Tensor& g) { return std::vector<Tensor>{g.narrow(0, 0, V).contiguous()}; });
}

Tensor GPT::head_input(const Tensor& x) const {
  MINIDL_CHECK(stage_.head, "GPT::head: this stage (blocks [", stage_.first_block, ", ", stage_.last_block,
               ")) does not hold the head");
  MINIDL_CHECK(x.dim() == 3 && x.size(2) == cfg_.n_embd, "GPT::head: expected x of shape (B, T, n_embd = ", cfg_.n_embd,
               "), got ", x.shape());
  return ln_f->forward(x);
}

Tensor GPT::padded_logits(const Tensor& x) const {
  // Tied head: logits = ln_f(x) @ wte^T, the transpose folded into the BLAS call.
  const Tensor in = head_input(x);  // checked before the table is touched
  return matmul(in, padded_head_weight(), false, true);
}

Tensor GPT::head(const Tensor& x) const {
  if (stage_.head && head_table()->style)  // split
    return head_table()->style->head_logits(*head_table(), head_input(x), cfg_.vocab_size);
  Tensor logits = padded_logits(x);
  return logits.size(2) == cfg_.vocab_size ? logits : logits.narrow(2, 0, cfg_.vocab_size);
}

Tensor GPT::head_loss(const Tensor& x, const Tensor& targets, Reduction reduction) const {
  // x holds T / n of targets' T positions where ln_f acts on one rank's slice of the sequence.
  const ParamLayout ln = ln_f ? layout_of(ln_f->weight) : ParamLayout{};
  const int64_t shards = ln.sequence_sliced ? ln.ranks : 1;
  MINIDL_CHECK(
      x.dim() == 3 && targets.dim() == 2 && targets.size(0) == x.size(0) && targets.size(1) == x.size(1) * shards,
      "GPT::head_loss: expected targets of shape (B, T) matching x ", x.shape(),
      shards > 1 ? " (this rank's T / n positions)" : "", ", got ", targets.shape());
  check_ids(targets, "targets", true);
  if (stage_.head && head_table()->style)  // split
    return head_table()->style->head_loss(*head_table(), head_input(x), targets, reduction);
  const int64_t N = targets.numel(), Vp = cfg_.padded_vocab();
  // The classifier reads the real V columns of rows Vp apart; the logits die here, so its backward may write
  // dlogits over them (autograd/functions.h).
  return cross_entropy(padded_logits(x).reshape({N, Vp}), targets.reshape({N}), -1, reduction, cfg_.vocab_size);
}

Tensor GPT::forward(const Tensor& ids) const { return head(blocks(0, cfg_.n_layer, embed(ids))); }

bool GPT::supports_kv_cache() const {
  return stage_.embedding && stage_.head && stage_.first_block == 0 && stage_.last_block == cfg_.n_layer &&
         sequence_shards() == 1;
}

int64_t GPT::sequence_shards() const {
  for (const Tensor& p : parameters())
    if (const ParamLayout l = layout_of(p); l.sequence_sliced) return l.ranks;
  return 1;
}

Tensor GPT::forward_cached(const Tensor& ids, KVCache& cache) const {
  MINIDL_CHECK(supports_kv_cache(), "GPT::forward_cached: needs the whole model in this process (not a part of ",
               "it; supports_kv_cache() is false)");
  MINIDL_CHECK(ids.dim() == 2 && ids.size(0) == 1 && ids.size(1) >= 1 && cache.length + ids.size(1) <= cfg_.block_size,
               "GPT::forward_cached: expected ids of shape (1, t) with ", cache.length,
               " + t <= block_size = ", cfg_.block_size, ", got ", ids.shape());
  check_ids(ids, "token ids", false);
  const Tensor positions = position_ids(cfg_.block_size, ids.device()).narrow(0, cache.length, ids.size(1));
  Tensor x;
  {
    ops::HostCheckedIndicesGuard in_range;  // [length, length + t) within block_size
    x = wpe ? drop->forward(wte->forward(ids) + wpe->forward(positions)) : drop->forward(wte->forward(ids));
  }
  cache.blocks.resize(size_t(cfg_.n_layer));
  for (int64_t i = 0; i < cfg_.n_layer; ++i)
    x = (*(h->begin() + i))->forward_cached(x, cache.blocks[size_t(i)], cache.length, cfg_.block_size);
  cache.length += ids.size(1);
  return head(x);
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets, Reduction reduction) const {
  MINIDL_CHECK(targets.shape() == ids.shape(), "GPT::loss: expected targets of the ids' shape ", ids.shape(), ", got ",
               targets.shape());
  const Device device = parameters().front().device();
  if (device.is_cpu() || !ids.device().is_cpu() || !targets.device().is_cpu())
    return head_loss(blocks(0, cfg_.n_layer, embed(ids)), targets, reduction);
  // A host batch for a model on a device: checked here, uploaded as i64 (the device kernels' index type, so no
  // conversion through the host later), and the device ops told not to check it again on a host copy.
  check_ids(ids, "token ids", false);
  check_ids(targets, "targets", true);
  // Through pinned staging on the compute stream: the host does not wait for the upload (core/upload.h).
  const Tensor device_ids = upload_async(ops::cast(ids.contiguous(), DType::i64), device);
  const Tensor device_targets = upload_async(ops::cast(targets.contiguous(), DType::i64), device);
  ops::HostCheckedIndicesGuard checked;
  return head_loss(blocks(0, cfg_.n_layer, embed(device_ids)), device_targets, reduction);
}

Recompute parse_recompute(const std::string& name) {
  for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kMlp, Recompute::kBlock})
    if (name == recompute_name(r)) return r;
  MINIDL_CHECK(false, "recompute: expected none, attn, mlp or block, got '", name, "'");
  return Recompute::kNone;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kAttn: return "attn";
    case Recompute::kMlp: return "mlp";
    case Recompute::kBlock: return "block";
  }
  return "?";
}

namespace {

// Sets a dropout context's position (step and first sample) for its scope and puts the previous one back.
class PinnedDropout {
 public:
  PinnedDropout(DropoutContext& ctx, const DropoutContext& pinned) : ctx_(ctx), previous_(ctx) {
    ctx.step = pinned.step;
    ctx.first_sample = pinned.first_sample;
  }
  ~PinnedDropout() { ctx_ = previous_; }
  PinnedDropout(const PinnedDropout&) = delete;
  PinnedDropout& operator=(const PinnedDropout&) = delete;

 private:
  DropoutContext& ctx_;
  DropoutContext previous_;
};

}  // namespace

// Runs part(x) as a checkpointed region whose recomputation sees the dropout position of this forward, even if the
// training loop moved the context (next micro-batch, next step) before backward: the masks are a function of
// (seed, stream, step, first sample) alone, so pinning those is all the "RNG state" there is to restore. The
// recomputation (every run of part after the first) is wrapped in the hooks' before/after_block(block, true).
Tensor GPT::checkpointed(std::function<Tensor(const Tensor&)> part, const Tensor& x, std::vector<Tensor> params,
                         int64_t block) const {
  const std::shared_ptr<DropoutContext>& ctx = dropout_ctx_;
  BlockHooks* hooks = block_hooks();
  const DropoutContext at_forward = *ctx;
  auto forward_ran = std::make_shared<bool>(false);  // shared by the copies autograd::checkpoint makes
  auto pinned = [part = std::move(part), ctx, at_forward, hooks, block, forward_ran](const Tensor& in) {
    const bool recompute = *forward_ran;
    *forward_ran = true;
    if (recompute && hooks) hooks->before_block(block, true);
    Tensor out;
    {
      PinnedDropout pin(*ctx, at_forward);
      out = part(in);
    }
    if (recompute && hooks) hooks->after_block(block, true);
    return out;
  };
  return autograd::checkpoint(pinned, x, params);
}

Tensor GPT::forward_block(int64_t i, const Tensor& x) const {
  // The lambdas hold the block by shared_ptr: the recomputation may run after this call returns.
  const std::shared_ptr<TransformerBlock> block = *(h->begin() + (i - stage_.first_block));
  auto attn_part = [block](const Tensor& in) { return block->attention_branch(in); };
  auto mlp_part = [block](const Tensor& in) { return block->mlp_branch(in); };
  switch (recompute_) {
    case Recompute::kNone: return block->forward(x);
    case Recompute::kBlock:
      return checkpointed([block](const Tensor& in) { return block->forward(in); }, x, block->parameters(), i);
    case Recompute::kAttn:
      return block->after_attention(x, checkpointed(attn_part, x, block->attention_parameters(), i));
    case Recompute::kMlp: {
      Tensor y = x + attn_part(x);
      return y + checkpointed(mlp_part, y, block->mlp_parameters(), i);
    }
  }
  return block->forward(x);
}

std::vector<Tensor> GPT::block_parameters(int64_t i) const {
  MINIDL_CHECK(i >= stage_.first_block && i < stage_.last_block, "GPT: block ", i, " is not held here (blocks [",
               stage_.first_block, ", ", stage_.last_block, "))");
  auto child = [](const Module& m, const std::string& name) -> const Module& {
    for (const auto& [n, c] : m.children())
      if (n == name) return *c;
    MINIDL_CHECK(false, "GPT: no module ", name);
    return m;
  };
  return child(child(child(*this, "transformer"), "h"), std::to_string(i)).parameters();
}

double GPT::flops_per_token(int64_t T) const {
  // A token runs k of an MoE block's E routed experts (the router and the shared expert: every token); a rank
  // holding E / ep of them (expert parallelism) runs them on the tokens of ep ranks: k / held either way.
  const std::vector<MoE*> moes = moe_layers(*this);
  const double expert_share = moes.empty() ? 1.0 : double(cfg_.moe_top_k) / double(moes.front()->experts->size());
  double whole = 0;  // the whole tensors' elements, whatever a parallelism split
  for (const auto& [name, p] : named_parameters())
    whole += double(layout_of(p).full_numel()) * (name.find(".moe.experts.") != std::string::npos ? expert_share : 1.0);
  for (const auto& table : {wpe, cfg_.tie_embeddings ? nullptr : wte})  // lookups, not products
    if (table) whole -= double(layout_of(table->weight).full_numel());
  const double width = double(cfg_.n_head * cfg_.head_size());
  return 6.0 * whole + 12.0 * double(cfg_.n_layer) * width * double(T);
}

}  // namespace minidl::nn
