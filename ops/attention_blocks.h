// Attention over blocks of a sequence: what context parallelism's ring attention computes, block by block.
//
//   auto [o, lse] = ops::attention_block_forward(q, k_blk, v_blk, H, Hkv, /*causal=*/false);  // one K/V block
//   ops::merge_attention_blocks(out, out_lse, o, lse);                                        // into the running
//   auto g = ops::attention_block_backward(dout, q, k_blk, v_blk, out, out_lse, H, Hkv, false);  // g.dq, g.dk, g.dv
//
// q: (B, Tq, H D) against k, v: (B, Tk, Hkv D), the same kernels as causal_attention on separate tensors. causal:
// the diagonal block (Tq = Tk, query i sees keys 0..i); else every query sees every key. The forward returns the
// block's normalised output and its logsumexp (B, H, Tq). Blocks merge by the online softmax, in f32 or wider:
//   out -= sigmoid(lse_b - lse) (out - out_b),   lse -= logsigmoid(lse - lse_b)
// (lse = -inf: nothing yet, out becomes out_b). The backward of one block takes the *merged* out and lse of the
// whole row (P = exp(S - lse) is then the row's true probability, and rowsum(dout * out) its softmax correction):
// it returns this block's share of dq and the block's dk, dv, which the ring sums. f32 and f64 on the CPU; f32 on
// CUDA devices (ops/cuda/attention_blocks.cu: a thread per row, the same formulas in f32).
#pragma once

#include "ops/attention.h"

namespace minidl::ops {

struct AttentionBlockGrads {
  Tensor dq, dk, dv;
};
AttentionForward attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                                         bool causal);
AttentionBlockGrads attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, int n_head, int n_kv_head,
                                             bool causal);
// out (B, T, H D), lse (B, H, T) updated in place with a block's out_b, lse_b of the same shapes and dtype.
void merge_attention_blocks(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);

// The CUDA kernels (ops/cuda/tensor/attention_blocks.cpp), called after the checks with f32 device tensors.
inline DeviceKernel<AttentionForward(const Tensor&, const Tensor&, const Tensor&, int, int, bool)>
    attention_block_forward_device{"attention_block"};
inline DeviceKernel<AttentionBlockGrads(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&, int, int, bool)>
    attention_block_backward_device{"attention_block_backward"};
inline DeviceKernel<void(Tensor&, Tensor&, const Tensor&, const Tensor&)> merge_attention_blocks_device{
    "merge_attention_blocks"};

// The argument checks: q, k and v f32 or f64 on the CPU (f32 on a CUDA device), alike, k's width n_kv_head times
// q's head dimension.
struct AttentionBlockDims {
  int64_t B, Tq, Tk, H, D, Hkv;
  int64_t C() const { return H * D; }
};
AttentionBlockDims check_attention_block(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                                         bool causal);

}  // namespace minidl::ops
