// Naive tensor parallelism (Megatron-LM): a GPT block's MLP and attention split across the N ranks of a group,
// each rank holding 1/N of the weights. Read after naive/ddp.h; production: dist/tensor_parallel.h, dist/tp_plan.h.
//
//   dist::naive::ParallelMLP mlp(whole_mlp, group);              // this rank's slices of an nn::MLP's weights
//   dist::naive::ParallelAttention attn(whole_attn, group);      // this rank's heads of an nn::CausalSelfAttention
//   Tensor y = mlp.forward(x);   // x, y: (B, T, C), the same on every rank; y equals whole_mlp.forward(x)
//
// Column then row. An MLP is y = gelu(x A) B with A (C, H), B (H, C). Split A by columns, A = [A_0 .. A_N-1],
// and B by rows, B = [B_0; ..; B_N-1]. Then gelu(x A) = [gelu(x A_0) .. gelu(x A_N-1)] (GELU is elementwise, so
// each rank applies it to its own columns without talking), and y = sum_r gelu(x A_r) B_r: rank r computes one
// term from its own slices, and one all-reduce sums the terms. The hidden activation (B, T, H/N per rank) never
// moves. Attention is the same shape: q, k and v by heads (columns of c_attn: heads are independent), then the
// output projection by the matching rows of c_proj.
//
// The two operators (x replicated: every rank holds the same x):
//   f (before the column-parallel layer): forward identity, backward all-reduce (sum). Rank r's x feeds only
//     x A_r, so its gradient dL/dx = dL/d(xA_r)·A_rᵀ is only rank r's term of the whole layer's sum over r.
//   g (after the row-parallel layer):     forward all-reduce (sum), backward identity. The output is the sum of
//     the ranks' terms, and the derivative of a sum with respect to each term is 1: every rank already holds dL/dy.
// A bias of the column layer is split with its columns; the row layer's bias is added once, after g.
//
// Communication per block, per rank: one all-reduce of (B, T, C) after attention and one after the MLP in
// forward, two in backward (the f's): 4 all-reduces of activations, none of weights. Memory: weights, their
// gradients and optimizer state 1/N each for these layers, and the hidden activations 1/N.
//
// What production adds: the whole tensor-parallel GPT (vocab-parallel embedding and cross-entropy, replicated
// LayerNorms), sequence parallelism (dist/sequence_parallel.h), initialisation of a shard straight from the
// global element index, gathering shards into whole-model checkpoints, and the traffic counters.
#pragma once

#include <cstdint>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "dist/process_group.h"
#include "nn/gpt.h"

namespace minidl::dist::naive {

// f: identity forward, all-reduce (sum) of the gradient backward.
inline Tensor f(const Tensor& x, ProcessGroup& group) {
  // EXERCISE(tensor_parallel): identity forward; backward all-reduces (sums) the incoming gradient.
  return autograd::record("naive_tp_f", {x}, x.detach(), [&group](const Tensor& gy) {
    Tensor sum = Tensor::empty(gy.shape());
    sum.copy_(gy);
    group.all_reduce(sum, ReduceOp::kSum)->wait();
    return std::vector<Tensor>{sum};
  });
  // END EXERCISE
}

// g: all-reduce (sum) forward, identity backward.
inline Tensor g(const Tensor& x, ProcessGroup& group) {
  // EXERCISE(tensor_parallel): all-reduce (sum) forward; identity backward.
  Tensor sum = Tensor::empty(x.shape());
  sum.copy_(x.detach());
  group.all_reduce(sum, ReduceOp::kSum)->wait();
  return autograd::record("naive_tp_g", {x}, sum, [](const Tensor& gy) { return std::vector<Tensor>{gy}; });
  // END EXERCISE
}

// Elements [begin, begin + n) of `whole` along dimension `dim`, copied into a new leaf parameter.
inline Tensor slice(const Tensor& whole, int dim, int64_t begin, int64_t n) {
  Tensor part = whole.detach().narrow(dim, begin, n);
  Tensor out = Tensor::empty(part.shape());
  out.copy_(part);
  return out.set_requires_grad(true);
}

// c_fc column-parallel (its bias split with its columns), c_proj row-parallel (its bias whole, added after g).
struct ParallelMLP {
  ParallelMLP(const nn::MLP& whole, ProcessGroup& group) : group(group) {
    // EXERCISE(tensor_parallel): c_fc column-parallel (this rank's H/N columns and their bias), c_proj row-parallel
    // (the matching H/N rows; its bias whole).
    const int64_t h = whole.c_fc->weight.shape()[1] / group.size(), first = group.rank() * h;
    fc_weight = slice(whole.c_fc->weight, 1, first, h);                       // (C, H/N)
    fc_bias = slice(whole.c_fc->bias, 0, first, h);                           // (H/N)
    proj_weight = slice(whole.c_proj->weight, 0, first, h);                   // (H/N, C)
    proj_bias = slice(whole.c_proj->bias, 0, 0, whole.c_proj->bias.numel());  // (C), replicated
    // END EXERCISE
  }
  // x: (B, T, C), replicated -> (B, T, C), replicated
  Tensor forward(const Tensor& x) const {
    // EXERCISE(tensor_parallel): f, this rank's columns with GELU, its rows, g, then the bias once.
    Tensor hidden = bias_gelu(matmul(f(x, group), fc_weight), fc_bias);  // (B, T, H/N): this rank's columns
    return add(g(matmul(hidden, proj_weight), group), proj_bias);        // sum over ranks of the row products
    // END EXERCISE
  }

  ProcessGroup& group;
  Tensor fc_weight, fc_bias, proj_weight, proj_bias;
};

// c_attn column-parallel by heads: rank r takes heads [r·n_head/N, (r+1)·n_head/N) of q, of k and of v (each C
// columns of c_attn's 3C); c_proj row-parallel: the rows that multiply those heads' outputs.
struct ParallelAttention {
  ParallelAttention(const nn::CausalSelfAttention& whole, ProcessGroup& group)
      : group(group), n_head(whole.n_head / group.size()) {
    MINIDL_CHECK(whole.n_head % group.size() == 0, "naive TP: ", whole.n_head, " heads do not split over ",
                 group.size(), " ranks");
    const int64_t C = whole.c_proj->weight.shape()[0], c = C / group.size(), first = group.rank() * c;
    attn_weight = Tensor::empty({C, 3 * c});
    attn_bias = Tensor::empty({3 * c});
    for (int64_t j = 0; j < 3; ++j) {  // q, k, v: this rank's columns of each, side by side (q_r, k_r, v_r)
      attn_weight.narrow(1, j * c, c).copy_(whole.c_attn->weight.detach().narrow(1, j * C + first, c));
      attn_bias.narrow(0, j * c, c).copy_(whole.c_attn->bias.detach().narrow(0, j * C + first, c));
    }
    attn_weight.set_requires_grad(true);
    attn_bias.set_requires_grad(true);
    proj_weight = slice(whole.c_proj->weight, 0, first, c);                   // (C/N, C)
    proj_bias = slice(whole.c_proj->bias, 0, 0, whole.c_proj->bias.numel());  // (C), replicated
  }
  // x: (B, T, C), replicated -> (B, T, C), replicated
  Tensor forward(const Tensor& x) const {
    // EXERCISE(tensor_parallel): f, this rank's heads' q, k, v and attention, its rows of c_proj, g, then the bias
    // once.
    Tensor heads = causal_attention(linear(f(x, group), attn_weight, attn_bias), int(n_head));  // (B, T, C/N)
    return add(g(matmul(heads, proj_weight), group), proj_bias);
    // END EXERCISE
  }

  ProcessGroup& group;
  int64_t n_head;  // this rank's heads
  Tensor attn_weight, attn_bias, proj_weight, proj_bias;
};

}  // namespace minidl::dist::naive
