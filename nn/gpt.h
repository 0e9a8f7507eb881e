// The decoder-only transformer minidl trains, in two architectures that share everything but their blocks' parts:
// - GPT-2 (the default): learned position embeddings, pre-LayerNorm blocks, tanh-GELU MLP, fused causal
//   self-attention, and an output head tied to the token embedding. Parameter names and layouts are Hugging Face's
//   GPT2LMHeadModel ("transformer.h.0.attn.c_attn.weight", weights (in, out)), so checkpoints load in PyTorch.
// - Llama (cfg.arch = kLlama, nn/llama.h): RMSNorm, rotary positions (no position table), a SwiGLU MLP, no biases,
//   grouped-query attention (n_kv_head key/value heads) and a tied or untied head. Its parameters use the same
//   tree of names (transformer.wte, transformer.h.<i>.{ln_1, attn, ln_2, mlp}, transformer.ln_f, lm_head);
//   nn/checkpoint.h maps them to LlamaForCausalLM's names and (out, in) layout in the files it writes and reads.
// The embedding, the attention core, the head and its loss, initialisation, stages, recomputation and everything
// above nn/ are the same code for both.
//
//   GPTConfig cfg{.vocab_size = 65, .block_size = 256, .n_layer = 6, .n_head = 6, .n_embd = 384, .dropout = 0.2};
//   GPT model(cfg, /*seed=*/1337);
//   model.dropout_context().step = step;          // once per forward: selects this step's dropout masks
//   Tensor loss = model.loss(ids, targets);       // ids, targets: (B, T) integers
//   loss.backward();
//   model.set_recompute(Recompute::kBlock);       // activation checkpointing per block (autograd/checkpoint.h)
//
// forward and loss are compositions of embed, blocks and head / head_loss, which a caller holding only part of the
// model runs piece by piece:
//   GPT first(cfg, 1337, {.first_block = 0, .last_block = 2, .head = false});      // wte, wpe, blocks 0, 1
//   GPT last(cfg, 1337, {.first_block = 2, .embedding = false});                   // blocks 2 .. n_layer-1, ln_f, wte
//   Tensor loss = last.head_loss(last.blocks(2, cfg.n_layer, first.blocks(0, 2, first.embed(ids))), targets);
//
// Initialisation is nanoGPT's: every Linear/Embedding weight N(0, 0.02), the residual projections
// (attn.c_proj.weight, mlp.c_proj.weight) N(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm weight 1.
// Parameter k of the whole model (in its named_parameters() order: wte, wpe, block 0 .. n_layer-1, ln_f) draws
// from Philox(seed, stream k), element i at counter i, so the weights are a function of (config, seed) alone, and a
// stage holding only some of them gets exactly the values the whole model has (the stream is the parameter's global
// position, computed from its name, not its position in the stage).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "autograd/functions.h"
#include "ops/rope.h"

#include "nn/block_hooks.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace minidl::nn {

struct MoEContext;

struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // longest sequence (number of learned positions)
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  double dropout = 0.0;  // embeddings and residual branches (see CausalSelfAttention)
  bool bias = true;      // biases in Linear and LayerNorm layers
  // The token embedding / tied head is stored with padded_vocab() = vocab_size rounded up to a multiple of
  // vocab_pad rows (GPT-2: 50257 -> 50304, llm.c's Vp), so the head GEMM and the classifier see aligned rows; where
  // that would add more than an eighth of vocab_size rows, to a multiple of vocab_pad / 2, / 4, ... instead (65
  // characters: 72, not 128, whose head GEMMs would be 97% padding: 0.6% of a baby step's FLOPs). Memory
  // layout only, invisible outside the model: the parameter transformer.wte.weight is (vocab_size, C) (the first
  // rows of the padded buffer), checkpoints, gradients, optimizer state and parameter counts are those of
  // vocab_size, losses ignore the padding, and logits are (B, T, vocab_size). Not stored in checkpoints and not
  // compared by ==. 1: no padding.
  int64_t vocab_pad = 64;

  // The architecture (see the top of this file). The fields below it are Llama's; GPT-2 takes their defaults.
  enum class Arch { kGPT2, kLlama };
  Arch arch = Arch::kGPT2;
  int64_t n_kv_head = 0;            // key/value heads, n_head a multiple of it (GQA; 1: MQA); 0: n_head
  int64_t head_dim = 0;             // 0: n_embd / n_head (which must then divide); Llama may set it explicitly
  int64_t intermediate_size = 0;    // the MLP's hidden width; 0: 4 * n_embd
  double norm_eps = 1e-5;           // the norms' eps (HF's rms_norm_eps; GPT-2's layer_norm_epsilon is 1e-5)
  double rope_theta = 10000.0;      // RoPE's base
  ops::RopeScaling rope_scaling{};  // none | linear | llama3 (ops/rope.h)
  bool tie_embeddings = true;       // false: the head is its own (vocab_size, C) table, lm_head (Llama only)
  // Mixture of experts (nn/moe.h; Llama only). 0 experts: every MLP is dense.
  enum class Router { kSoftmax, kSigmoid };
  enum class Balance { kAux, kBias, kNone };
  int64_t moe_experts = 0;               // E SwiGLU experts of width mlp_width() per MoE block
  int64_t moe_top_k = 2;                 // experts per token
  int64_t moe_every = 1;                 // block i is MoE when i % moe_every == 0 (Megatron's moe_layer_freq)
  int64_t moe_shared = 0;                // shared experts every token passes through (DeepSeek's)
  Router moe_router = Router::kSoftmax;  // softmax with the top k renormalised (Mixtral), or sigmoid (DeepSeek-V3)
  Balance moe_balance = Balance::kAux;   // the auxiliary loss, the bias (auxiliary-loss-free), or none
  double moe_aux_coef = 0.01;            // α of the auxiliary loss
  double moe_bias_rate = 1e-3;           // the bias update's step (DeepSeek-V3's γ)
  double moe_capacity = 0;               // capacity factor (slots per expert over N k / E); 0: dropless

  bool llama() const { return arch == Arch::kLlama; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  bool moe() const { return moe_experts > 0; }
  bool moe_layer(int64_t block) const { return moe() && block % moe_every == 0; }

  int64_t padded_vocab() const {
    int64_t multiple = std::max<int64_t>(vocab_pad, 1);
    const auto padded = [&] { return (vocab_size + multiple - 1) / multiple * multiple; };
    while (multiple > 1 && 8 * (padded() - vocab_size) > vocab_size) multiple /= 2;
    return padded();
  }
  // Throws naming the field, what was expected and what was given.
  void validate() const;
  // Equal as models: every field but vocab_pad (a layout choice; the padded and the unpadded model compute the same
  // function and store the same checkpoint).
  bool operator==(const GPTConfig& o) const;
};

// Activation checkpointing per transformer block: which part keeps only its input in forward and is re-run in
// backward (autograd::checkpoint, with the part's parameters listed so their gradient hooks fire once).
//   kNone:  everything saved;  kAttn: ln_1 + attention (x -> attn(ln_1(x)));  kMlp: ln_2 + MLP;
//   kBlock: the whole block (its input is all a block keeps).
// A runtime choice, not architecture: it is not part of GPTConfig or of checkpoints, and results are bitwise the
// same whatever it is.
enum class Recompute { kNone, kAttn, kMlp, kBlock };
// "none", "attn", "mlp", "block"; anything else is an error listing these.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute r);

// Where a process's positions sit in the whole sequence: local index [local, local + length) is global position
// [global, global + length).
struct PositionRun {
  int64_t local = 0, global = 0, length = 0;
};

// How the attention core runs once a parallelism applied from outside the model has split the sequence (context
// parallelism, dist/context_parallel.h, installed by dist::apply_context_parallel). An attention without one runs
// the fused causal attention of its own positions: one null check per call.
struct AttentionStyle {
  virtual ~AttentionStyle() = default;
  // qkv (B, T, (H + 2 Hkv) D) of this process's T positions -> their causal attention over the whole sequence.
  virtual Tensor attend(const Tensor& qkv, int n_head, int n_kv_head) const = 0;
  // This process's T positions in the whole sequence (rotary positions are turned by these).
  virtual std::vector<PositionRun> runs(int64_t T) const = 0;
};

// qkv = x @ c_attn (C, 3C) -> causal_attention over its heads -> c_proj (C, C) -> dropout. The heads are counted
// from qkv's width (3 · heads · head_dim), so an attention whose c_attn a parallelism split (this rank's heads of
// q, k and v) runs unchanged on them.
// The fused attention kernel keeps no T x T probability matrix, so there is no dropout on the attention
// probabilities (attn_pdrop is 0 in the exported config.json); dropout applies to the residual branch.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx);
  // x: (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) const;

  // The heads of a qkv (..., 3 · heads · head_dim) that c_attn wrote.
  int heads(const Tensor& qkv) const { return int(qkv.size(qkv.dim() - 1) / (3 * head_dim)); }

  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;
  int64_t n_head, head_dim;                     // of the whole model
  std::shared_ptr<const AttentionStyle> style;  // null: as written
};

// c_fc (C, 4C) -> gelu(. + bias) fused -> c_proj (4C, C) -> dropout.
class MLP : public Module {
 public:
  MLP(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> ctx);
  // x: (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> dropout;
};

// One block's keys and values of the positions a generation has computed (KVCache).
struct BlockKV {
  // This process's key/value heads (n_kv_head of them: a grouped-query model keeps n_kv_head / n_head of an MHA
  // cache's bytes), filled up to KVCache::length: the keys transposed, (kv_heads, head_dim, block_size), so a new
  // query's scores are one row against a row-major matrix (the products' row path), and the values
  // (kv_heads, block_size, head_dim).
  Tensor k_t, v;
};

// The attention of a block's new positions with a cache, what every block kind shares: qkv (1, t, (heads + 2 *
// kv_heads) * D), this process's q, k and v heads as ops/attention.h lays them out (positions already rotated
// where the model rotates them), at positions [length, length + t) -> (1, t, heads * D). length == 0: the fused
// causal attention over the t positions (the uncached forward's own arithmetic), keeping their keys and values in
// `kv`; length > 0: t == 1, the new query against the kept keys and values (a product and a softmax: one position's
// work), query head h reading key/value head h / (heads / kv_heads).
Tensor cached_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, BlockKV& kv, int64_t length,
                        int64_t block_size);

// A pre-norm transformer block, x + attn(norm_1(x)), then + mlp(norm_2(.)): what GPT runs, recomputes and hooks,
// whichever architecture's parts (Block, nn::LlamaBlock) it holds. Parameters: the attention branch's, then the
// MLP branch's.
class TransformerBlock : public Module {
 public:
  // x: (B, T, C) -> (B, T, C)
  virtual Tensor forward(const Tensor& x) const { return after_attention(x, attention_branch(x)); }
  // attn(norm_1(x)) and mlp(norm_2(x)): the parts activation checkpointing may re-run.
  virtual Tensor attention_branch(const Tensor& x) const = 0;
  virtual Tensor mlp_branch(const Tensor& x) const = 0;
  // y = x + a, then y + mlp_branch(y).
  virtual Tensor after_attention(const Tensor& x, const Tensor& a) const {
    const Tensor y = x + a;
    return y + mlp_branch(y);
  }
  virtual std::vector<Tensor> attention_parameters() const = 0;
  virtual std::vector<Tensor> mlp_parameters() const = 0;
  // Inference with a cache: x (1, t, C) at positions [length, length + t), its attention by cached_attention.
  virtual Tensor forward_cached(const Tensor& x, BlockKV& kv, int64_t length, int64_t block_size) const = 0;

 protected:
  // A branch's parameters: its norm's, then its module's.
  static std::vector<Tensor> branch_parameters(const Module& norm, const Module& body) {
    std::vector<Tensor> out = norm.parameters(), more = body.parameters();
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }
};

// GPT-2's pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). Uses dropout streams first_stream and
// first_stream + 1.
class Block : public TransformerBlock {
 public:
  Block(const GPTConfig& cfg, uint64_t first_stream, std::shared_ptr<const DropoutContext> ctx);
  Tensor attention_branch(const Tensor& x) const override { return attn->forward(ln_1->forward(x)); }
  Tensor mlp_branch(const Tensor& x) const override { return mlp->forward(ln_2->forward(x)); }
  // The residual add and ln_2 in one fused op (one pass over the stream each way instead of two).
  Tensor after_attention(const Tensor& x, const Tensor& a) const override;
  std::vector<Tensor> attention_parameters() const override;
  std::vector<Tensor> mlp_parameters() const override;
  Tensor forward_cached(const Tensor& x, BlockKV& kv, int64_t length, int64_t block_size) const override;

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

// The part of the model a GPT holds (one chunk of a model cut into parts): blocks [first_block, last_block), the
// embedding (wte, wpe and the embedding dropout) and the head (ln_f and the tied wte, so the first and the last stage
// both hold a copy of wte). Parameters keep their whole-model names ("transformer.h.5.ln_1.weight" on any stage holding
// block 5), initial values and dropout streams.
struct GPTStage {
  int64_t first_block = 0;
  int64_t last_block = -1;  // -1: n_layer
  bool embedding = true;
  bool head = true;
};

// The keys and values of every block for the positions a generation has computed: with them each new token costs
// one position instead of the whole window (GPT::forward_cached, train::generate). Batch 1.
struct KVCache {
  std::vector<BlockKV> blocks;
  int64_t length = 0;  // positions computed
};

class GPT : public BlockModule {
 public:
  // The whole model.
  explicit GPT(const GPTConfig& cfg, uint64_t seed = 0);
  // Only `stage`'s part of it (see GPTStage). Throws unless 0 <= first_block <= last_block <= n_layer.
  GPT(const GPTConfig& cfg, uint64_t seed, GPTStage stage);

  // ids: (B, T) i32/i64 with T <= block_size and values in [0, vocab_size) -> logits (B, T, vocab_size)
  // = head(blocks(0, n_layer, embed(ids))) (a view of rows padded_vocab() apart: never a padded id).
  Tensor forward(const Tensor& ids) const;
  // Mean (or, with Reduction::kSum, summed) cross-entropy of the next-token predictions (fused softmax +
  // cross-entropy over (B*T, V)). targets: same shape as ids, values in [0, vocab_size) or -1 (ignored).
  // = head_loss(blocks(0, n_layer, embed(ids)), targets). For a model on a device, ids and targets may be on the
  // host: they are then range-checked there (the same messages) and uploaded once as i64, and no device op copies
  // them back to check them again (ops::HostCheckedIndicesGuard), so a training step makes no host round trip
  // for them.
  Tensor loss(const Tensor& ids, const Tensor& targets, Reduction reduction = Reduction::kMean) const;
  // Generation with a cache (inference, batch 1): ids (1, t) at positions [cache.length, cache.length + t) ->
  // their logits (1, t, vocab_size), reading and extending `cache`. The first call (cache.length == 0) runs
  // forward()'s arithmetic (its logits are forward(ids)'s bit for bit); later calls take one id each. Needs the
  // whole model in this process (supports_kv_cache()) and cache.length + t <= block_size.
  Tensor forward_cached(const Tensor& ids, KVCache& cache) const;
  // Whether forward_cached works here: the whole model (not a chunk of it), every position on this process (its
  // parameters are not sequence-sliced: nn::ParamLayout).
  bool supports_kv_cache() const;
  // Over how many ranks the positions between the blocks are split: n when the parameters say they act on one
  // rank's slice of the sequence (sequence parallelism: nn::ParamLayout's sequence_sliced), else 1.
  int64_t sequence_shards() const;

  // The pieces of forward; each throws if this stage does not hold the part it needs.
  // ids: (B, T) as in forward -> drop(wte(ids) + wpe(0 .. T-1)): (B, T, C) (B, T / n, C: sequence_shards())
  Tensor embed(const Tensor& ids) const;
  // x: (B, T, C) through global blocks [a, b) under the recompute setting, calling the block hooks -> (B, T, C)
  Tensor blocks(int64_t a, int64_t b, const Tensor& x) const;
  // x: (B, T, C) -> ln_f, then the tied head x @ wte^T: logits (B, T, vocab_size) (through wte's style when one
  // split the vocabulary: the whole logits)
  Tensor head(const Tensor& x) const;
  // x: (B, T, C) -> cross-entropy of head(x) against targets (B, T), as in loss
  Tensor head_loss(const Tensor& x, const Tensor& targets, Reduction reduction = Reduction::kMean) const;
  // Throws unless every value of ids (i32/i64, (B, T)) lies in [0, vocab_size), or is -1 with allow_ignore; `what`
  // names them in the message ("token ids", "targets"). A device tensor is checked on a host copy unless
  // ops::HostCheckedIndicesGuard vouches for it: loss() and the training step check a host batch before upload.
  void check_ids(const Tensor& ids, const char* what, bool allow_ignore) const;

  // Training FLOPs per token (forward + backward) at sequence length T, nanoGPT's estimate_mfu formula:
  //   6 * N + 12 * n_layer * (n_head * head_dim) * T
  // where N counts the parameters that multiply: all but the lookup tables (wpe; wte too when the head is untied,
  // lm_head then doing the head's work; the tied wte does matmul work as the head): 2 FLOPs per multiply-add,
  // times 3 for forward plus the two backward matmuls. So SwiGLU's three matrices and grouped-query attention's
  // smaller k and v projections count as they are; an MoE block's routed experts count k / E of their parameters
  // (each token runs k of them; k / held on a rank holding some: expert parallelism). The second term is the attention
  // scores and weighted sum (QK^T and AV), which use no parameters (n_head * head_dim = n_embd for GPT-2). On a stage,
  // N counts the parameters it holds, as whole tensors (nn::ParamLayout).
  double flops_per_token(int64_t T) const;

  const GPTConfig& config() const { return cfg_; }
  // Shared by every dropout in the model: set .step once per forward (see DropoutContext).
  DropoutContext& dropout_context() { return *dropout_ctx_; }
  // Shared by every MoE layer (nn/moe.h): the auxiliary loss's gradient weight, set once per step.
  MoEContext& moe_context() { return *moe_ctx_; }
  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  // What this GPT holds; last_block is resolved (never -1).
  const GPTStage& stage() const { return stage_; }
  // BlockModule: the blocks of this stage (set_block_hooks: called around each, nn/block_hooks.h has the order),
  // and the parameters of global block i as registered under "transformer.h.<i>".
  int64_t first_block() const override { return stage_.first_block; }
  int64_t num_blocks() const override { return stage_.last_block - stage_.first_block; }
  std::vector<Tensor> block_parameters(int64_t i) const override;

  // Null where the stage does not hold them (GPTStage); h holds blocks [first_block, last_block), entry i being
  // global block first_block + i.
  std::shared_ptr<Embedding> wte, wpe;  // token (V, C) and position (block_size, C; GPT-2 only) embeddings
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList<TransformerBlock>> h;
  std::shared_ptr<Norm> ln_f;          // LayerNorm (GPT-2) or RMSNorm (Llama)
  std::shared_ptr<Embedding> lm_head;  // the untied head's (V, C) table (!tie_embeddings); else the head is wte
  // Block i (local index) as the architecture's kind (Block for GPT-2, nn::LlamaBlock); throws if it is another.
  template <class B>
  const B& block(size_t i) const {
    const B* b = dynamic_cast<const B*>(&(*h)[i]);
    MINIDL_CHECK(b != nullptr, "GPT::block: block ", i, " is not of the kind asked for");
    return *b;
  }

 private:
  // x through global block i under the recompute setting.
  Tensor forward_block(int64_t i, const Tensor& x) const;
  // part(x) as an activation-checkpointed region of global block `block` (autograd::checkpoint over `params`)
  // whose recomputation draws this forward's dropout masks and is wrapped in the block hooks.
  Tensor checkpointed(std::function<Tensor(const Tensor&)> part, const Tensor& x, std::vector<Tensor> params,
                      int64_t block) const;
  // Position ids [0, T) on `device`: built once per device (positions_[device] holds [0, block_size)).
  Tensor position_ids(int64_t T, Device device) const;
  // x: (B, T, C) checked, through ln_f.
  Tensor head_input(const Tensor& x) const;
  // x: (B, T, C) -> ln_f, then the tied head against the padded table: (B, T, padded_vocab()) whose columns at or
  // past vocab_size are padding (zero rows of the table: logits 0, never read by the loss or by head()).
  Tensor padded_logits(const Tensor& x) const;
  // wte's weight (V, C) as the first rows of the (Vp, C) table the head multiplies by, differentiably (the padded
  // rows' gradient is dropped). Free when the weight still lies in its padded buffer; after Module::to (which moves
  // only the V rows) the weight is put back into one (Tensor::set_data, so every holder sees it), and when the
  // weight is a view into someone else's buffer (a flat buffer of many parameters) the padded table is a copy made
  // per call.
  Tensor padded_head_weight() const;
  // The table the head multiplies by: wte, or lm_head when untied (null where this stage has no head).
  const Embedding* head_table() const { return lm_head ? lm_head.get() : wte.get(); }
  void init_weights(uint64_t seed);
  // Position of the parameter `name` in the whole model's named_parameters() order.
  int64_t global_parameter_index(const std::string& name) const;

  GPTConfig cfg_;
  GPTStage stage_;
  std::shared_ptr<DropoutContext> dropout_ctx_;
  std::shared_ptr<MoEContext> moe_ctx_;
  Recompute recompute_ = Recompute::kNone;
  mutable Tensor positions_;  // [0, block_size) as i64 on the device of the last embed (not thread-safe)
  // The (Vp, C) buffer the head table's weight is the first rows of (weak: it lives as long as the weight uses it).
  mutable std::weak_ptr<Storage> padded_wte_;
};

}  // namespace minidl::nn
