// Tensor parallelism, Megatron-LM style: one layer's weights split across the ranks of a tensor-parallel (tp) group,
// with the two communication operators that keep the split layer computing exactly what the whole layer does.
//
//   dist::ProcessGroup& tp = topology.tp_group();
//   dist::ColumnParallelLinear fc(C, 4 * C, tp);       // weight (C, 4C / tp): rank r's columns
//   dist::RowParallelLinear proj(4 * C, C, tp);        // weight (4C / tp, C): rank r's rows; bias (C), replicated
//   Tensor y = proj.forward(gelu(fc.forward(x)));      // x, y: (B, T, C), the same on every rank of the group
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
// dist/sequence_parallel.h; the layers below switch to it with their sequence_parallel flags.
//
// Every rank starts from the one-process weights: ShardLayout says which part of a whole parameter a rank holds,
// and is used for initialisation (by global element index, nn::init_normal_slice), for loading a whole checkpoint,
// and for gathering the whole parameter back to save it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/module.h"

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

// Which part of a whole parameter of shape full_shape one rank holds. The split dimension `dim` is cut into
// `parts` equal parts (c_attn: 3, for q, k and v), and each part into `ranks` slices of ceil(part / ranks); rank r
// holds slice r of every part, concatenated. Where a slice runs past the end of its part (a vocabulary of 65 at
// tp 2: 33 rows each, the second rank's last row past 65) the local rows are padding: zero, never read back into
// the whole parameter. dim = -1: replicated (the rank holds the whole parameter).
struct ShardLayout {
  Shape full_shape;
  int dim = -1;
  int64_t parts = 1;
  int ranks = 1, rank = 0;

  static ShardLayout replicated(const Shape& full_shape) { return {full_shape, -1, 1, 1, 0}; }
  bool is_split() const { return dim >= 0 && ranks > 1; }
  // The shape of the local tensor.
  Shape local_shape() const;
  // The contiguous runs of the split dimension (split layouts only): local [local_start, local_start + length)
  // holds whole [full_start, full_start + length).
  struct Piece {
    int64_t full_start, local_start, length;
  };
  std::vector<Piece> pieces() const;
  // Local tensor (f32, CPU) from the whole parameter: the pieces copied, padding zero.
  Tensor slice(const Tensor& full) const;
  // Writes this rank's local tensor into the whole parameter `full` (the pieces only).
  void scatter_into(Tensor& full, const Tensor& local) const;
  // Fills local (f32, contiguous, CPU) with N(0, std^2) drawn as nn::init_normal(whole, std, seed, stream) draws
  // the whole parameter, so the split model starts from the one-process weights. Padding stays zero.
  void init_normal(Tensor& local, double std, uint64_t seed, uint64_t stream) const;
};

// Y = X A + b with A (in, out) split by columns: weight (in, out / tp), bias (out / tp). Input replicated (passed
// through f), output split: rank r's out / tp features. parts > 1: the out features are `parts` concatenated blocks
// (q, k, v) each split by columns, so rank r's output is its slice of each block, in block order.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group, bool bias = true,
                       int64_t parts = 1);
  // x: (..., in), replicated (with sequence_parallel: (B, T / tp, in), this rank's positions) -> (..., out / tp)
  Tensor forward(const Tensor& x) const;
  // x @ weight without the bias (the MLP adds it inside the fused GELU).
  Tensor product(const Tensor& x) const;

  Tensor weight, bias;
  ShardLayout weight_layout, bias_layout;
  bool sequence_parallel = false;

 private:
  ProcessGroup& group_;
};

// Y = X B + b with B (in, out) split by rows: weight (in / tp, out); the bias (out) is replicated and added once,
// after the all-reduce (adding it on every rank before the sum would count it tp times).
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group, bool bias = true);
  // x: (..., in / tp), this rank's slice -> (..., out), replicated (with sequence_parallel: reduce-scattered to
  // (B, T / tp, out), the bias added to this rank's positions)
  Tensor forward(const Tensor& x) const;

  Tensor weight, bias;
  ShardLayout weight_layout, bias_layout;
  bool sequence_parallel = false;

 private:
  ProcessGroup& group_;
};

// A token embedding (V, C) split by rows (vocabulary ranges): rank r holds rows [r * Vr, (r + 1) * Vr) with
// Vr = ceil(V / tp); rows at or past V are padding. The lookup gives zeros for ids outside the rank's range, and
// g sums the ranks' results: every id is found on exactly one rank. As the tied output head, logits() gives the
// rank's slice of the vocabulary, padding at -inf so it never wins a softmax or a sample.
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(int64_t vocab_size, int64_t embedding_dim, ProcessGroup& group);
  // ids: integers in [0, V), any shape -> (*ids.shape, C), replicated (with sequence_parallel, ids (B, T) ->
  // (B, T / tp, C), this rank's positions: reduce-scattered instead of all-reduced)
  Tensor forward(const Tensor& ids) const;
  // x: (..., C), replicated (passed through f; with sequence_parallel (B, T / tp, C), gathered) -> (..., Vr):
  // x @ weight^T with padded columns at -inf
  Tensor logits(const Tensor& x) const;

  Tensor weight;  // (Vr, C)
  ShardLayout weight_layout;
  int64_t vocab_size, vocab_start, vocab_per_rank;
  bool sequence_parallel = false;

 private:
  ProcessGroup& group_;
  mutable Tensor pad_mask_;  // (Vr): 0, or -inf on padded rows; undefined when there are none
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

// Attention split by heads: c_attn column-parallel with q, k, v as three parts, so rank r holds heads
// [r * H / tp, (r + 1) * H / tp) of each and causal_attention runs unchanged on H / tp heads; c_proj row-parallel.
class ParallelSelfAttention : public nn::Module {
 public:
  ParallelSelfAttention(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t dropout_stream,
                        std::shared_ptr<const nn::DropoutContext> ctx);
  // x: (B, T, C), replicated -> (B, T, C), replicated; with sequence parallelism (B, T / tp, C) in and out
  Tensor forward(const Tensor& x) const;
  void set_sequence_parallel(bool on);

  std::shared_ptr<ColumnParallelLinear> c_attn;
  std::shared_ptr<RowParallelLinear> c_proj;
  std::shared_ptr<nn::Dropout> resid_dropout;
  int64_t local_heads;

 private:
  ProcessGroup& group_;
  std::shared_ptr<const nn::DropoutContext> ctx_;
  bool sequence_parallel_ = false;
};

// The MLP column then row: c_fc (C, 4C) by columns (its bias inside the fused GELU, as the one-process MLP), c_proj
// (4C, C) by rows.
class ParallelMLP : public nn::Module {
 public:
  ParallelMLP(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t dropout_stream,
              std::shared_ptr<const nn::DropoutContext> ctx);
  // x: (B, T, C), replicated -> (B, T, C), replicated; with sequence parallelism (B, T / tp, C) in and out
  Tensor forward(const Tensor& x) const;
  void set_sequence_parallel(bool on);

  std::shared_ptr<ColumnParallelLinear> c_fc;
  std::shared_ptr<RowParallelLinear> c_proj;
  std::shared_ptr<nn::Dropout> dropout;

 private:
  ProcessGroup& group_;
  std::shared_ptr<const nn::DropoutContext> ctx_;
  bool sequence_parallel_ = false;
};

}  // namespace minidl::dist
