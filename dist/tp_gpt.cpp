#include "dist/tp_gpt.h"

#include <cmath>

#include "autograd/node.h"
#include "nn/checkpoint.h"
#include "nn/safetensors.h"
#include "ops/embedding.h"

namespace minidl::dist {

ParallelBlock::ParallelBlock(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t first_stream,
                             std::shared_ptr<const nn::DropoutContext> ctx) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(cfg.n_embd, cfg.bias));
  attn = register_module("attn", std::make_shared<ParallelSelfAttention>(cfg, group, first_stream, ctx));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<ParallelMLP>(cfg, group, first_stream + 1, ctx));
}

Tensor ParallelBlock::forward(const Tensor& x) const {
  Tensor y = x + attn->forward(ln_1->forward(x));
  return y + mlp->forward(ln_2->forward(y));
}

Tensor ParallelBlock::forward_cached(const Tensor& x, nn::BlockKV& kv, int64_t length, int64_t block_size) const {
  // As ParallelSelfAttention::forward (dropout is off at inference), with the cache's attention.
  const Tensor a =
      nn::cached_attention(attn->c_attn->forward(ln_1->forward(x)), attn->local_heads, kv, length, block_size);
  Tensor y = x + attn->c_proj->forward(a);
  return y + mlp->forward(ln_2->forward(y));
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<Tensor> concat(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Position of `name` in the whole model's named_parameters() order (nn::GPT's initialisation streams): wte, wpe,
// then each block's parameters in the order a block registers them (`block_names`), then ln_f's (`ln_f_names`).
int64_t whole_model_index(const std::string& name, const nn::GPTConfig& cfg,
                          const std::vector<std::string>& block_names, const std::vector<std::string>& ln_f_names) {
  if (name == "transformer.wte.weight") return 0;
  if (name == "transformer.wpe.weight") return 1;
  auto position = [&](const std::vector<std::string>& names, const std::string& n) {
    for (size_t j = 0; j < names.size(); ++j)
      if (names[j] == n) return int64_t(j);
    MINIDL_ASSERT(false, "TensorParallelGPT: no parameter named ", name);
    return int64_t(-1);
  };
  const int64_t per_block = cfg.bias ? 12 : 6;
  const std::string blocks = "transformer.h.", ln_f = "transformer.ln_f.";
  if (name.rfind(blocks, 0) == 0) {
    const size_t dot = name.find('.', blocks.size());
    const int64_t i = std::stoll(name.substr(blocks.size(), dot - blocks.size()));
    return 2 + i * per_block + position(block_names, name.substr(dot + 1));
  }
  MINIDL_ASSERT(name.rfind(ln_f, 0) == 0, "TensorParallelGPT: unexpected parameter ", name);
  return 2 + cfg.n_layer * per_block + position(ln_f_names, name.substr(ln_f.size()));
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& np : m.named_parameters()) out.push_back(np.first);
  return out;
}

}  // namespace

TensorParallelGPT::TensorParallelGPT(const nn::GPTConfig& cfg, uint64_t seed, ProcessGroup& group,
                                     bool sequence_parallel, nn::GPTStage stage_part)
    : nn::GPT(cfg, seed, stage_part, NoModules{}), group_(group), sequence_parallel_(sequence_parallel) {
  MINIDL_CHECK(cfg.n_head % group.size() == 0, "tensor parallelism: --tp ", group.size(), " must divide --heads ",
               cfg.n_head, " (attention is split by heads)");
  const nn::GPTStage& part = stage();
  const nn::SkipDefaultInit skip;  // the parameters are initialised below, as one process's GPT would be
  const uint64_t base = nn::DropoutContext::kDropoutStreamBase;
  std::shared_ptr<nn::DropoutContext> ctx = dropout_context_ptr();
  // The whole model's module tree and names (nn::GPT's constructor), with parallel layers in place of the split ones.
  auto transformer = register_module("transformer", std::make_shared<nn::Module>());
  if (part.embedding || part.head)
    vocab_embedding = transformer->register_module(
        "wte", std::make_shared<VocabParallelEmbedding>(cfg.vocab_size, cfg.n_embd, group));
  if (part.embedding) {
    wpe = transformer->register_module("wpe", std::make_shared<nn::Embedding>(cfg.block_size, cfg.n_embd));
    drop = transformer->register_module("drop", std::make_shared<nn::Dropout>(cfg.dropout, base, ctx));
  }
  parallel_blocks =
      transformer->register_module("h", std::make_shared<nn::ModuleList<ParallelBlock>>(part.first_block));
  for (int64_t i = part.first_block; i < part.last_block; ++i)
    parallel_blocks->push_back(std::make_shared<ParallelBlock>(cfg, group, base + 1 + 2 * uint64_t(i), ctx));
  if (part.head) ln_f = transformer->register_module("ln_f", std::make_shared<nn::LayerNorm>(cfg.n_embd, cfg.bias));
  if (vocab_embedding) vocab_embedding->sequence_parallel = sequence_parallel;
  for (const auto& block : *parallel_blocks) {
    block->attn->set_sequence_parallel(sequence_parallel);
    block->mlp->set_sequence_parallel(sequence_parallel);
  }

  // Layouts by name: split where a parallel layer says so, replicated everywhere else.
  for (const auto& [name, p] : named_parameters()) layouts_[name] = ShardLayout::replicated(p.shape());
  if (vocab_embedding) layouts_["transformer.wte.weight"] = vocab_embedding->weight_layout;
  for (int64_t i = part.first_block; i < part.last_block; ++i) {
    const ParallelBlock& b = (*parallel_blocks)[size_t(i - part.first_block)];
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    layouts_[h + "attn.c_attn.weight"] = b.attn->c_attn->weight_layout;
    layouts_[h + "attn.c_proj.weight"] = b.attn->c_proj->weight_layout;
    layouts_[h + "mlp.c_fc.weight"] = b.mlp->c_fc->weight_layout;
    layouts_[h + "mlp.c_proj.weight"] = b.mlp->c_proj->weight_layout;
    if (cfg.bias) {
      layouts_[h + "attn.c_attn.bias"] = b.attn->c_attn->bias_layout;
      layouts_[h + "mlp.c_fc.bias"] = b.mlp->c_fc->bias_layout;
    }
  }
  // nn::GPT's initialisation, slice by slice: parameter k of the whole model (this model registers the same names
  // in the same order) draws from Philox(seed, stream k) at its whole-parameter element indices.
  const double residual_std = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
  const std::vector<std::string> block_names =
      parallel_blocks->size() ? names_of((*parallel_blocks)[0]) : std::vector<std::string>{};
  const std::vector<std::string> ln_f_names = ln_f ? names_of(*ln_f) : std::vector<std::string>{};
  for (auto& [name, p] : named_parameters()) {
    if (p.dim() != 2) continue;
    const bool residual = ends_with(name, ".attn.c_proj.weight") || ends_with(name, ".mlp.c_proj.weight");
    const int64_t k = whole_model_index(name, cfg, block_names, ln_f_names);
    layouts_.at(name).init_normal(p, residual ? residual_std : 0.02, seed, uint64_t(k));
  }
}

int64_t TensorParallelGPT::logical_num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) {
    int64_t e = 1;
    for (int64_t d : layout(name).full_shape) e *= d;
    n += e;
  }
  return n;
}

Tensor TensorParallelGPT::embed(const Tensor& ids) const {
  MINIDL_CHECK(stage().embedding, "GPT::embed: this stage (blocks [", stage().first_block, ", ", stage().last_block,
               ")) does not hold the embedding");
  MINIDL_CHECK(ids.dim() == 2, "GPT::forward: expected ids of shape (B, T), got ", ids.shape());
  const int64_t T = ids.size(1);
  MINIDL_CHECK(T >= 1 && T <= config().block_size,
               "GPT::forward: sequence length must be in [1, block_size = ", config().block_size, "], got T = ", T);
  check_ids(ids, "token ids", false);
  if (sequence_parallel_ && group_.size() > 1) {
    // This rank's positions only: the token embeddings reduce-scattered along the sequence, its rows of wpe.
    MINIDL_CHECK(T % group_.size() == 0, "--sequence-parallel: the sequence length T = ", T,
                 " must be a multiple of --tp ", group_.size());
    const int64_t Tr = T / group_.size();
    Tensor pos_emb;
    {
      ops::HostCheckedIndicesGuard in_range;
      pos_emb = wpe->forward(position_ids(T, ids.device()).narrow(0, int64_t(group_.rank()) * Tr, Tr));
    }
    return sequence_parallel_dropout(*drop, *dropout_context_ptr(), vocab_embedding->forward(ids) + pos_emb, group_);
  }
  Tensor pos_emb;
  {
    ops::HostCheckedIndicesGuard in_range;
    pos_emb = wpe->forward(position_ids(T, ids.device()));
  }
  return drop->forward(vocab_embedding->forward(ids) + pos_emb);
}

// As embed: sequence parallelism splits the positions only over more than one rank.
bool TensorParallelGPT::supports_kv_cache() const {
  return !(sequence_parallel_ && group_.size() > 1) && nn::GPT::supports_kv_cache();
}

Tensor TensorParallelGPT::embed_at(const Tensor& ids, int64_t first) const {
  MINIDL_CHECK(supports_kv_cache(), "TensorParallelGPT: the KV cache needs the whole sequence on every rank (no ",
               "sequence parallelism)");
  const Tensor positions = position_ids(config().block_size, ids.device()).narrow(0, first, ids.size(1));
  ops::HostCheckedIndicesGuard in_range;
  return drop->forward(vocab_embedding->forward(ids) + wpe->forward(positions));
}

Tensor TensorParallelGPT::forward_block_cached(int64_t i, const Tensor& x, nn::BlockKV& kv, int64_t length) const {
  return (*(parallel_blocks->begin() + (i - stage().first_block)))->forward_cached(x, kv, length, config().block_size);
}

Tensor TensorParallelGPT::head(const Tensor& x) const {
  MINIDL_CHECK(stage().head, "GPT::head: this stage (blocks [", stage().first_block, ", ", stage().last_block,
               ")) does not hold the head");
  MINIDL_CHECK(x.dim() == 3 && x.size(2) == config().n_embd,
               "GPT::head: expected x of shape (B, T, n_embd = ", config().n_embd, "), got ", x.shape());
  Tensor whole = gather_from_tensor_parallel(vocab_embedding->logits(ln_f->forward(x)), group_);
  // Padding rows sit at the end of the padded vocabulary: the first vocab_size columns are the real ones.
  return whole.narrow(2, 0, config().vocab_size);
}

Tensor TensorParallelGPT::head_loss(const Tensor& x, const Tensor& targets, Reduction reduction) const {
  MINIDL_CHECK(stage().head, "GPT::head_loss: this stage (blocks [", stage().first_block, ", ", stage().last_block,
               ")) does not hold the head");
  MINIDL_CHECK(x.dim() == 3 && targets.dim() == 2 && targets.size(0) == x.size(0) &&
                   targets.size(1) == x.size(1) * (sequence_parallel_ ? group_.size() : 1),
               "GPT::head_loss: expected targets (B, T) for x ", x.shape(),
               sequence_parallel_ ? " (this rank's T / tp positions)" : "", ", got ", targets.shape());
  check_ids(targets, "targets", true);
  Tensor z = vocab_embedding->logits(ln_f->forward(x));  // (B, T, V / tp)
  const int64_t N = targets.numel();
  return vocab_parallel_cross_entropy(z.reshape({N, z.size(2)}), targets.reshape({N}), vocab_embedding->vocab_start,
                                      group_, -1, reduction);
}

Tensor TensorParallelGPT::forward_block(int64_t i, const Tensor& x) const {
  // As nn::GPT::forward_block; the lambdas hold the block by shared_ptr for a recomputation after this returns.
  const std::shared_ptr<ParallelBlock> block = *(parallel_blocks->begin() + (i - stage().first_block));
  auto attn_part = [block](const Tensor& in) { return block->attn->forward(block->ln_1->forward(in)); };
  auto mlp_part = [block](const Tensor& in) { return block->mlp->forward(block->ln_2->forward(in)); };
  switch (recompute()) {
    case nn::Recompute::kNone: return block->forward(x);
    case nn::Recompute::kBlock:
      return checkpointed([block](const Tensor& in) { return block->forward(in); }, x, block->parameters(), i);
    case nn::Recompute::kAttn: {
      Tensor y = x + checkpointed(attn_part, x, concat(block->ln_1->parameters(), block->attn->parameters()), i);
      return y + mlp_part(y);
    }
    case nn::Recompute::kMlp: {
      Tensor y = x + attn_part(x);
      return y + checkpointed(mlp_part, y, concat(block->ln_2->parameters(), block->mlp->parameters()), i);
    }
  }
  return block->forward(x);
}

double TensorParallelGPT::flops_per_token(int64_t T) const {
  double n = 0;
  for (const auto& [name, l] : layouts_) {
    if (name == "transformer.wpe.weight") continue;
    double e = 1;
    for (int64_t d : l.full_shape) e *= double(d);
    n += e;
  }
  return 6.0 * n + 12.0 * double(config().n_layer) * double(config().n_embd) * double(T);
}

const ShardLayout& TensorParallelGPT::layout(const std::string& name) const {
  auto it = layouts_.find(name);
  MINIDL_CHECK(it != layouts_.end(), "TensorParallelGPT: no parameter named ", name);
  return it->second;
}

std::vector<Tensor> TensorParallelGPT::replicated_parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, p] : named_parameters())
    if (!layout(name).is_split()) out.push_back(p);
  return out;
}

nn::StateDict TensorParallelGPT::gather_state_dict() const {
  nn::StateDict whole;
  for (auto& [name, t] : gather_whole(named_parameters())) whole[name] = t;
  return whole;
}

nn::NamedTensors TensorParallelGPT::gather_whole(const nn::NamedTensors& local,
                                                 const std::function<bool(const std::string&)>& keep) const {
  autograd::NoGradGuard no_grad;
  nn::NamedTensors whole;
  const int n = group_.size();
  for (const auto& [name, p] : local) {
    const ShardLayout& mine = layout(name);
    MINIDL_ASSERT(p.shape() == mine.local_shape(), "gather_whole: ", name, " has shape ", p.shape(), ", expected ",
                  mine.local_shape());
    const bool kept = !keep || keep(name);
    if (!mine.is_split()) {
      if (kept) whole.emplace_back(name, p.to(Device::cpu()).clone());
      continue;
    }
    Tensor all = Tensor::empty({int64_t(n) * p.numel()}, p.dtype(), p.device());
    group_.all_gather(all, p.contiguous())->wait();
    if (!kept) continue;
    all = all.to(Device::cpu());
    Tensor full = Tensor::zeros(mine.full_shape, p.dtype());
    for (int r = 0; r < n; ++r) {
      ShardLayout theirs = mine;
      theirs.rank = r;  // every rank's layout is the same function of its rank
      theirs.scatter_into(full, all.narrow(0, int64_t(r) * p.numel(), p.numel()).reshape(p.shape()));
    }
    whole.emplace_back(name, full);
  }
  return whole;
}

void TensorParallelGPT::load_whole_state_dict(const nn::StateDict& whole) {
  autograd::NoGradGuard no_grad;
  nn::StateDict mine;
  for (const auto& [name, p] : named_parameters()) {
    auto it = whole.find(name);
    MINIDL_CHECK(it != whole.end(), "TensorParallelGPT: the checkpoint has no tensor ", name);
    mine[name] = layout(name).slice(it->second);
  }
  load_state_dict(mine, /*strict=*/true);
}

void save_tensor_parallel_gpt(const std::string& path, const TensorParallelGPT& model, const std::string& vocab_json,
                              const nn::Metadata& extras, bool write) {
  nn::StateDict whole = model.gather_state_dict();  // collective: every rank of the group takes part
  if (!write || model.group().rank() != 0) return;
  // A one-process GPT holds the whole tensors, so the file is exactly what a one-process run writes.
  nn::GPT one(model.config());
  one.load_state_dict(whole, /*strict=*/true);
  nn::save_gpt(path, one, vocab_json, extras);
}

void load_tensor_parallel_gpt(TensorParallelGPT& model, const std::string& path) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  try {
    model.load_whole_state_dict(file.tensors);
  } catch (const Error& e) {
    MINIDL_CHECK(false, "load ('", path, "') at tensor parallel size ", model.group().size(), ": ", e.what());
  }
}

}  // namespace minidl::dist
