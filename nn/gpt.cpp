#include "nn/gpt.h"

#include <cmath>
#include <type_traits>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"

namespace minidl::nn {

void GPTConfig::validate() const {
  MINIDL_CHECK(vocab_size > 0, "GPTConfig: expected vocab_size > 0, got ", vocab_size);
  MINIDL_CHECK(block_size > 0, "GPTConfig: expected block_size > 0, got ", block_size);
  MINIDL_CHECK(n_layer > 0, "GPTConfig: expected n_layer > 0, got ", n_layer);
  MINIDL_CHECK(n_head > 0, "GPTConfig: expected n_head > 0, got ", n_head);
  MINIDL_CHECK(n_embd > 0 && n_embd % n_head == 0, "GPTConfig: n_embd must be a positive multiple of n_head (", n_head,
               "), got n_embd = ", n_embd);
  MINIDL_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: expected 0 <= dropout < 1, got ", dropout);
}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, uint64_t dropout_stream,
                                         std::shared_ptr<const DropoutContext> ctx)
    : n_head(cfg.n_head) {
  c_attn = register_module("c_attn", std::make_shared<Linear>(cfg.n_embd, 3 * cfg.n_embd, cfg.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(cfg.n_embd, cfg.n_embd, cfg.bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  Tensor y = causal_attention(c_attn->forward(x), int(n_head));
  return resid_dropout->forward(c_proj->forward(y));
}

MLP::MLP(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * cfg.n_embd, cfg.n_embd, cfg.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor MLP::forward(const Tensor& x) const {
  // The bias is added inside the fused GELU kernel: one pass over the (B, T, 4C) activation instead of two.
  Tensor pre = matmul(x, c_fc->weight);
  Tensor h = c_fc->bias.defined() ? bias_gelu(pre, c_fc->bias) : gelu(pre);
  return dropout->forward(c_proj->forward(h));
}

Block::Block(const GPTConfig& cfg, uint64_t first_stream, std::shared_ptr<const DropoutContext> ctx) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, first_stream, ctx));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(cfg, first_stream + 1, ctx));
}

Tensor Block::forward(const Tensor& x) const {
  Tensor y = x + attn->forward(ln_1->forward(x));
  return y + mlp->forward(ln_2->forward(y));
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed) : cfg_(cfg), dropout_ctx_(std::make_shared<DropoutContext>()) {
  cfg.validate();
  dropout_ctx_->seed = seed;
  const uint64_t base = DropoutContext::kDropoutStreamBase;
  // HF nests everything but the (tied) head under "transformer".
  auto transformer = register_module("transformer", std::make_shared<Module>());
  wte = transformer->register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd));
  wpe = transformer->register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd));
  drop = transformer->register_module("drop", std::make_shared<Dropout>(cfg.dropout, base, dropout_ctx_));
  h = transformer->register_module("h", std::make_shared<ModuleList<Block>>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) h->push_back(std::make_shared<Block>(cfg, base + 1 + 2 * i, dropout_ctx_));
  ln_f = transformer->register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  init_weights(seed);
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void GPT::init_weights(uint64_t seed) {
  // Every 2-D parameter of a GPT is a Linear or Embedding weight; 1-D ones (biases, LayerNorm) keep the 0 / 1
  // their layers were built with. The residual projections add into the residual stream once per block and
  // branch, so they are scaled down to keep its variance independent of depth (GPT-2 paper, section 2.3).
  const double residual_std = 0.02 / std::sqrt(2.0 * double(cfg_.n_layer));
  NamedTensors params = named_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto& [name, p] = params[k];
    if (p.dim() != 2) continue;
    bool residual = ends_with(name, ".attn.c_proj.weight") || ends_with(name, ".mlp.c_proj.weight");
    init_normal(p, residual ? residual_std : 0.02, seed, k);
  }
}

void GPT::check_ids(const Tensor& ids, const char* what, bool allow_ignore) const {
  MINIDL_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, "GPT: expected ", what,
               " of dtype i32 or i64, got ", ids.dtype());
  Tensor c = ids.to(Device::cpu()).contiguous();  // a device batch is checked on a host copy
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

Tensor GPT::forward(const Tensor& ids) const {
  MINIDL_CHECK(ids.dim() == 2, "GPT::forward: expected ids of shape (B, T), got ", ids.shape());
  const int64_t T = ids.size(1);
  MINIDL_CHECK(T >= 1 && T <= cfg_.block_size,
               "GPT::forward: sequence length must be in [1, block_size = ", cfg_.block_size, "], got T = ", T);
  check_ids(ids, "token ids", false);

  Tensor pos = Tensor::arange(T, DType::i64).to(ids.device());
  Tensor x = wte->forward(ids) + wpe->forward(pos);  // (B, T, C) + (T, C), broadcast over the batch
  x = drop->forward(x);
  for (const auto& block : *h) x = forward_block(block, x);
  x = ln_f->forward(x);
  // Tied head: logits = x @ wte^T, the transpose folded into the BLAS call.
  return matmul(x, wte->weight, false, true);
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets, Reduction reduction) const {
  MINIDL_CHECK(targets.shape() == ids.shape(), "GPT::loss: expected targets of the ids' shape ", ids.shape(), ", got ",
               targets.shape());
  check_ids(targets, "targets", true);
  Tensor logits = forward(ids);
  const int64_t N = ids.numel();
  return cross_entropy(logits.reshape({N, cfg_.vocab_size}), targets.reshape({N}), -1, reduction);
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

// Runs part(x) as a checkpointed region whose recomputation sees the dropout position of this forward, even if the
// training loop moved the context (next micro-batch, next step) before backward: the masks are a function of
// (seed, stream, step, first sample) alone, so pinning those is all the "RNG state" there is to restore.
Tensor checkpointed(std::function<Tensor(const Tensor&)> part, const Tensor& x, std::vector<Tensor> params,
                    const std::shared_ptr<DropoutContext>& ctx) {
  const DropoutContext at_forward = *ctx;
  auto pinned = [part = std::move(part), ctx, at_forward](const Tensor& in) {
    PinnedDropout pin(*ctx, at_forward);
    return part(in);
  };
  return autograd::checkpoint(pinned, x, params);
}

std::vector<Tensor> concat(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

Tensor GPT::forward_block(const std::shared_ptr<Block>& block, const Tensor& x) const {
  // The lambdas hold the block by shared_ptr: the recomputation may run after this call returns.
  auto attn_part = [block](const Tensor& in) { return block->attn->forward(block->ln_1->forward(in)); };
  auto mlp_part = [block](const Tensor& in) { return block->mlp->forward(block->ln_2->forward(in)); };
  switch (recompute_) {
    case Recompute::kNone:
      return block->forward(x);
    case Recompute::kBlock:
      return checkpointed([block](const Tensor& in) { return block->forward(in); }, x, block->parameters(),
                          dropout_ctx_);
    case Recompute::kAttn: {
      Tensor y = x + checkpointed(attn_part, x, concat(block->ln_1->parameters(), block->attn->parameters()),
                                  dropout_ctx_);
      return y + mlp_part(y);
    }
    case Recompute::kMlp: {
      Tensor y = x + attn_part(x);
      return y + checkpointed(mlp_part, y, concat(block->ln_2->parameters(), block->mlp->parameters()),
                              dropout_ctx_);
    }
  }
  return block->forward(x);
}

double GPT::flops_per_token(int64_t T) const {
  const double n = double(num_parameters() - wpe->weight.numel());
  return 6.0 * n + 12.0 * double(cfg_.n_layer) * double(cfg_.n_embd) * double(T);
}

}  // namespace minidl::nn
