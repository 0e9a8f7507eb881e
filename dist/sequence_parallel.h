// Sequence parallelism: the part of tensor parallelism (dist/tensor_parallel.h) that splits the residual stream
// along the sequence between the parallel layers.
//
//   dist::apply_tensor_parallel(model, tp, dist::gpt2_plan(/*sequence_parallel=*/true));   // the usual way
//   Tensor x = dist::reduce_scatter_to_sequence_parallel(partial, tp);   // (B, T, C) sums -> (B, T / tp, C)
//   Tensor y = dist::sequence_parallel_linear(layernorm(x, w, b), c_fc_weight, c_fc_bias, tp);   // (B, T, 4C / tp)
//
// Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"):
// between the tensor-parallel regions the residual stream is split along the sequence, (B, T / tp, C) per rank,
// so LayerNorm, dropout and the residual adds run on 1/tp of the positions and their activations take 1/tp of the
// memory. An all-reduce is a reduce-scatter followed by an all-gather, so the same bytes move:
//   before a column-parallel layer, the all-gather along T that rebuilds the whole sequence replaces f (backward:
//   the gradients of the whole sequence are summed over ranks, each keeping its positions: a reduce-scatter);
//   after a row-parallel layer, a reduce-scatter along T replaces g's all-reduce (backward: an all-gather).
// Parameters used on the sequence slice (LayerNorms, wpe, the row-parallel biases) now see only this rank's
// positions, so their gradients are partial sums that must be all-reduced over the group
// (train::GradSync::after_backward).
#pragma once

#include "dist/process_group.h"
#include "nn/layers.h"

namespace minidl::dist {

// x: (B, T, C), a partial sum on each rank -> (B, T / tp, C): positions [rank * T / tp, ...) of the sum.
Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, ProcessGroup& group);
// x: (B, T / tp, C), this rank's positions -> (B, T, C), the whole sequence on every rank.
Tensor gather_from_sequence_parallel(const Tensor& x, ProcessGroup& group);
// x (B, T / tp, in) gathered along the sequence, then @ weight + bias: what a column-parallel layer computes under
// sequence parallelism, as one autograd node that keeps only this rank's x (1/tp of the gathered input) and
// gathers it again in backward, as Megatron-LM does: saving the gathered input would keep a whole-sequence
// activation per column-parallel layer, most of what sequence parallelism saves. Backward: the weight's gradient
// from the re-gathered input, the input's by a reduce-scatter of gy @ weight^T.
Tensor sequence_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, ProcessGroup& group);
// Dropout of this rank's positions x: (B, T / tp, C) with exactly the masks one process draws for them (per
// sample, the run of positions starts at Philox element ((first_sample + b) * T + rank * T / tp) * C of the step).
Tensor sequence_parallel_dropout(const nn::Dropout& dropout, const nn::DropoutContext& ctx, const Tensor& x,
                                 ProcessGroup& group);

}  // namespace minidl::dist
