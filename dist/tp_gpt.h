// TensorParallelGPT: nn::GPT with every transformer block and the vocabulary split across a tensor-parallel group
// (dist/tensor_parallel.h). It is an nn::GPT (embed, blocks, head, head_loss, loss, forward, dropout, recompute and
// block hooks behave as documented there), so train::train_step, evaluate and sample run it unchanged; only its
// parameters are this rank's slices.
//
//   dist::Topology topo(ctx.world(), {.dp = 1, .tp = 2}, "ring");
//   dist::TensorParallelGPT model(cfg, /*seed=*/1337, topo.tp_group());   // the one-process weights, split
//   Tensor loss = model.loss(ids, targets);   // every rank of the group passes the same batch and gets the loss
//   loss.backward();
//   nn::StateDict whole = model.gather_state_dict();                       // collective: whole HF GPT-2 tensors
//
// Per block: attention split by heads (c_attn by columns, q/k/v taken per head range; c_proj by rows), the MLP
// column then row; LayerNorms, wpe and the row-parallel biases are replicated (the same gradient on every rank).
// The token embedding and the tied head are split by vocabulary (padded to a multiple of tp, whatever
// GPTConfig::vocab_pad says: that padding is nn::GPT's); the loss is the vocabulary-parallel cross-entropy, so no
// rank ever holds the whole (B, T, V) logits in training. head() (what sampling reads) gathers them, padding dropped.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/sequence_parallel.h"
#include "dist/tensor_parallel.h"
#include "nn/gpt.h"
#include "nn/safetensors.h"

namespace minidl::dist {

// Pre-LN block of parallel layers: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class ParallelBlock : public nn::Module {
 public:
  ParallelBlock(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t first_stream,
                std::shared_ptr<const nn::DropoutContext> ctx);
  // x: (B, T, C), replicated -> (B, T, C), replicated
  Tensor forward(const Tensor& x) const;
  // Generation with a cache (nn::cached_attention over this rank's heads): x (1, t, C), replicated.
  Tensor forward_cached(const Tensor& x, nn::BlockKV& kv, int64_t length, int64_t block_size) const;

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<ParallelSelfAttention> attn;
  std::shared_ptr<ParallelMLP> mlp;
};

class TensorParallelGPT : public nn::GPT {
 public:
  // The whole model, or only `stage`'s part of it (a pipeline stage: nn::GPTStage, whole-model names and initial
  // values), split over `group`. Throws unless group.size() divides n_head.
  // sequence_parallel: the residual stream between the parallel layers is split along the sequence (see
  // dist/sequence_parallel.h): blocks(), head() and head_loss() take (B, T / tp, C), embed() returns it, and the
  // sequence length must be a multiple of the group size; loss() and forward() are unchanged.
  TensorParallelGPT(const nn::GPTConfig& cfg, uint64_t seed, ProcessGroup& group, bool sequence_parallel = false,
                    nn::GPTStage stage = {});

  Tensor embed(const Tensor& ids) const override;
  // Whole logits (B, T, vocab_size), gathered from the ranks (sampling; training uses head_loss).
  Tensor head(const Tensor& x) const override;
  Tensor head_loss(const Tensor& x, const Tensor& targets, Reduction reduction = Reduction::kMean) const override;
  // Of the whole model (the one-process count), not of this rank's slices.
  double flops_per_token(int64_t T) const override;

  // Which part of the whole parameter `name` this rank holds.
  const ShardLayout& layout(const std::string& name) const;
  // The parameters every rank of the group holds whole (LayerNorms, wpe, row-parallel biases): a gradient norm
  // counts them once, not tp times.
  std::vector<Tensor> replicated_parameters() const;
  // Collective over the group: every parameter whole, with Hugging Face GPT-2 names and layouts (q, k, v back in
  // their ranges, vocabulary padding dropped), on the CPU.
  nn::StateDict gather_state_dict() const;
  // Collective over the group: any per-parameter tensors shaped like this rank's parameters (`local`, in
  // named_parameters() order on every rank: e.g. AdamW's m) as whole tensors, with the same names, the same
  // re-interleaving and padding dropped as gather_state_dict, on the CPU. What a training checkpoint stores. Only
  // the tensors `keep` names are returned (every rank takes part in every all-gather); none given: all.
  nn::NamedTensors gather_whole(const nn::NamedTensors& local,
                                const std::function<bool(const std::string&)>& keep = {}) const;
  // Loads this rank's slices from whole parameters (a one-process checkpoint). Missing or misshapen tensors throw.
  void load_whole_state_dict(const nn::StateDict& whole);
  ProcessGroup& group() const { return group_; }
  bool sequence_parallel() const { return sequence_parallel_; }

  // Of the whole model's parameters this GPT holds, the element count of the whole (unsplit) tensors: what one
  // process's num_parameters() counts for the same stage.
  int64_t logical_num_parameters() const;

  std::shared_ptr<VocabParallelEmbedding> vocab_embedding;         // transformer.wte (null on a stage without it)
  std::shared_ptr<nn::ModuleList<ParallelBlock>> parallel_blocks;  // transformer.h: global blocks of the stage

  // The KV cache works on a split without sequence parallelism: each rank keeps its own heads' keys and values.
  bool supports_kv_cache() const override;

 protected:
  Tensor forward_block(int64_t i, const Tensor& x) const override;
  Tensor embed_at(const Tensor& ids, int64_t first) const override;
  Tensor forward_block_cached(int64_t i, const Tensor& x, nn::BlockKV& kv, int64_t length) const override;

 private:
  ProcessGroup& group_;
  bool sequence_parallel_;
  std::map<std::string, ShardLayout> layouts_;
};

// Collective over model.group(): writes the whole model as nn::save_gpt does (one Hugging Face GPT-2 safetensors
// file and config.json, loadable at any --tp) from the group's rank 0 when `write` is true on it.
void save_tensor_parallel_gpt(const std::string& path, const TensorParallelGPT& model, const std::string& vocab_json,
                              const nn::Metadata& extras, bool write);
// Loads a whole-model checkpoint (nn::save_gpt's, or the above) into this rank's slices.
void load_tensor_parallel_gpt(TensorParallelGPT& model, const std::string& path);

}  // namespace minidl::dist
