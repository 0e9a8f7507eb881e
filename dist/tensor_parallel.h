// Tensor parallelism, Megatron-LM style: one layer's weights split across the ranks of a tensor-parallel (tp) group,
// with the two communication operators that keep the split layer computing exactly what the whole layer does. The
// layers are the model's own (nn::Linear, nn::Embedding, nn::Dropout): a style below makes one compute on this
// rank's slices, and dist::apply_tensor_parallel (dist/tp_plan.h) installs them from a plan, outside the model.
//
//   dist::apply_tensor_parallel(model, topology.tp_group(), dist::gpt2_plan(/*sequence_parallel=*/false));
//   // now mlp.c_fc computes linear(f(x), its columns), mlp.c_proj g(x_r @ its rows) + bias: the same y
//
// The two operators (Megatron's f and g; x replicated means every rank of the group holds the same x):
//
//   f = copy_to_tensor_parallel:      forward identity,   backward all-reduce (sum)
//   g = reduce_from_tensor_parallel:  forward all-reduce, backward identity
//
// Why f: a column-parallel layer computes Y_r = X A_r from a replicated X. The whole layer's dL/dX is the sum over
// the column blocks, sum_r dL/dY_r A_r^T, but rank r only has its own term: the gradient of X must be all-reduced
// before it continues into the replicated part of the network. The forward needs nothing: X is already everywhere.
// Why g: a row-parallel layer computes the partial product X_r B_r from its slice X_r of the input; the output is
// the sum over r, so the forward all-reduces. Backward: dL/d(X_r B_r) is dL/dY itself (the sum's derivative is 1),
// which every rank already holds, replicated: identity.
// Column then row (attention: q/k/v by heads, then the output projection; MLP: c_fc, then c_proj) puts one f
// before and one g after each pair, so a transformer block costs two all-reduces forward and two backward, and the
// activation between the two layers (heads, the 4C hidden units) never moves.
//
// Sequence parallelism (the residual stream split along the sequence between these layers) is in
// dist/sequence_parallel.h; the styles take it as their "sequence" placement.
//
// Every rank starts from the one-process weights: each split parameter carries its nn::ParamLayout, which says
// which part of the whole parameter it holds, and is used for loading a whole checkpoint and for gathering the
// whole parameter back to save it (gather_whole).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/param_layout.h"

namespace minidl::dist {

// What tensor parallelism asked its groups to move since the last reset, process-wide, in payload bytes (the
// tensor's dtype): the whole tensor of an all-reduce, the gathered output of an all-gather, the input of a
// reduce-scatter. A ring sends 2(n-1)/n of an all-reduce's payload per rank and (n-1)/n of the others'.
struct TensorParallelTraffic {
  int64_t all_reduce_bytes = 0, all_gather_bytes = 0, reduce_scatter_bytes = 0;
};
TensorParallelTraffic tensor_parallel_traffic();
void reset_tensor_parallel_traffic();

// The blocking collectives tensor and sequence parallelism issue, each counted in tensor_parallel_traffic().
void counted_all_reduce(Tensor& tensor, ProcessGroup& group, ReduceOp op);
void counted_all_gather(Tensor& output, const Tensor& input, ProcessGroup& group);
void counted_reduce_scatter(Tensor& output, const Tensor& input, ProcessGroup& group);  // sum

// Sums every tensor over the group in place, through one flat buffer (the replicated parameters' partial gradients
// under sequence parallelism). Tensors of one dtype and device.
void all_reduce_sum(const std::vector<Tensor>& tensors, ProcessGroup& group);

// f: identity forward, all-reduce (sum) of the gradient over `group` backward.
Tensor copy_to_tensor_parallel(const Tensor& x, ProcessGroup& group);
// g: all-reduce (sum) over `group` forward, identity backward.
Tensor reduce_from_tensor_parallel(const Tensor& x, ProcessGroup& group);
// x: (..., n) on every rank -> (..., size * n): the ranks' x side by side along the last dimension (rank order).
// Backward: each rank keeps its own slice of the gradient. (Only for outputs that must be whole, like the logits a
// sampler reads; training never gathers.)
Tensor gather_from_tensor_parallel(const Tensor& x, ProcessGroup& group);

// Which part of a whole parameter one rank holds: the layout each split or replicated parameter carries
// (nn/param_layout.h).
using ShardLayout = nn::ParamLayout;

// Collective over each split tensor's group: `local` (one tensor per entry of `params`, shaped like it and in the
// same order: the parameters themselves, or AdamW's moments of them) as whole tensors on the CPU, with local's
// names, q, k and v back in their ranges and padding dropped, by each parameter's own layout; the tensor of a
// parameter that is not split passes through (copied to the CPU). Only the tensors `keep` names are returned (every
// rank takes part in every all-gather); none given: all.
nn::NamedTensors gather_whole(const std::vector<Tensor>& params, const nn::NamedTensors& local,
                              const std::function<bool(const std::string&)>& keep = {});

// ---- the styles: how a layer of the unmodified model computes once its parameters are this rank's slices ----
// (installed, and the parameters split, by dist::apply_tensor_parallel: dist/tp_plan.h). A "sequence" placement is
// sequence parallelism's: the activation between the tensor-parallel layers holds this rank's T / tp positions.

// Y = X A + b with A (in, out) split by columns: weight (in, out / tp), bias (out / tp). Input replicated (passed
// through f; sequence placement: this rank's positions, gathered along the sequence), output split: rank r's
// out / tp features. With q, k and v as three parts (c_attn), rank r's output is its slice of each, in order: its
// heads, which causal_attention takes as they are.
class ColumnParallel final : public nn::LinearStyle {
 public:
  ColumnParallel(ProcessGroup& group, bool sequence_input) : group_(group), sequence_input_(sequence_input) {}
  // x: (..., in) -> (..., out / tp)
  Tensor forward(const nn::Linear& l, const Tensor& x) const override;
  Tensor product(const nn::Linear& l, const Tensor& x) const override;

 private:
  ProcessGroup& group_;
  bool sequence_input_;
};

// Y = X B + b with B (in, out) split by rows: weight (in / tp, out); the bias (out) is replicated and added once,
// after the all-reduce (adding it on every rank before the sum would count it tp times). Sequence placement: the
// partial products reduce-scattered along the sequence, the bias added to this rank's positions.
class RowParallel final : public nn::LinearStyle {
 public:
  RowParallel(ProcessGroup& group, bool sequence_output) : group_(group), sequence_output_(sequence_output) {}
  // x: (..., in / tp), this rank's slice -> (..., out), replicated (sequence: (B, T / tp, out))
  Tensor forward(const nn::Linear& l, const Tensor& x) const override;
  Tensor product(const nn::Linear& l, const Tensor& x) const override;

 private:
  Tensor reduce(const Tensor& partial) const;
  ProcessGroup& group_;
  bool sequence_output_;
};

// A token embedding (V, C) split by rows (vocabulary ranges): rank r holds rows [r * Vr, (r + 1) * Vr) with
// Vr = ceil(V / tp); rows at or past V are padding. The lookup gives zeros for ids outside the rank's range, and
// g sums the ranks' results (sequence placement: reduce-scattered along the sequence): every id is found on exactly
// one rank. As the tied output head: this rank's slice of the logits, padding at -inf so it never wins a softmax or
// a sample; the whole logits gathered for sampling, the loss without them (vocab_parallel_cross_entropy).
class VocabParallel final : public nn::EmbeddingStyle {
 public:
  VocabParallel(ProcessGroup& group, int64_t vocab_size, bool sequence_output);
  // ids: integers in [0, V), any shape -> (*ids.shape, C), replicated (sequence: ids (B, T) -> (B, T / tp, C))
  Tensor forward(const nn::Embedding& e, const Tensor& ids) const override;
  Tensor head_logits(const nn::Embedding& e, const Tensor& x, int64_t vocab) const override;
  Tensor head_loss(const nn::Embedding& e, const Tensor& x, const Tensor& targets, Reduction reduction) const override;
  // x: (..., C), replicated (sequence: (B, T / tp, C), gathered) -> (..., Vr): x @ weight^T, padded columns -inf
  Tensor local_logits(const nn::Embedding& e, const Tensor& x) const;

  int64_t vocab_size, vocab_start, vocab_per_rank;

 private:
  ProcessGroup& group_;
  bool sequence_output_;
  mutable Tensor pad_mask_;  // (Vr): 0, or -inf on padded rows; undefined when there are none
};

// Sequence parallelism's dropout: this rank's positions with the masks one process draws for them.
class SequenceParallelDropout final : public nn::DropoutStyle {
 public:
  explicit SequenceParallelDropout(ProcessGroup& group) : group_(group) {}
  Tensor forward(const nn::Dropout& d, const Tensor& x) const override;

 private:
  ProcessGroup& group_;
};

// Sequence parallelism's position embedding: ids (T) -> this rank's rows [r * T / tp, (r + 1) * T / tp).
class SequenceShardedPositions final : public nn::EmbeddingStyle {
 public:
  explicit SequenceShardedPositions(ProcessGroup& group) : group_(group) {}
  Tensor forward(const nn::Embedding& e, const Tensor& ids) const override;

 private:
  ProcessGroup& group_;
};

// Cross-entropy over a vocabulary split across the group, without any rank holding the whole logits:
//   m = max over the vocabulary: local row maxima, all-reduced with max (a constant for the gradient: the loss
//       does not depend on it);
//   S = sum over the vocabulary of exp(z - m): local sums, then g (all-reduce forward, identity backward);
//   z_t = the target's logit: the rank whose range holds the target contributes it, the others 0, then g;
//   loss per row = log S + m - z_t.
// Backward through g is the identity, so each rank gets exactly its slice of softmax - onehot.
// local_logits: (N, Vr), this rank's vocabulary [vocab_start, vocab_start + Vr), padded columns -inf;
// targets: (N) integers in [0, V) or ignore_index. Computed in f32 (autocast off inside).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets, int64_t vocab_start,
                                    ProcessGroup& group, int64_t ignore_index = -1,
                                    Reduction reduction = Reduction::kMean);

}  // namespace minidl::dist
