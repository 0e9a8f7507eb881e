// Fused causal self-attention, flash style (Dao et al., 2022), without autograd.
//
//   auto [y, lse] = ops::causal_attention_forward(qkv, n_head);         // qkv: (B, T, 3C) -> y: (B, T, C)
//   Tensor dqkv = ops::causal_attention_backward(dy, qkv, y, lse, n_head);
//
// qkv is GPT-2's c_attn output: along the last dimension q = [0, C), k = [C, 2C), v = [2C, 3C), and within each
// head h takes columns [h*D, (h+1)*D), D = C / n_head. The output has the heads merged the same way.
// Per (batch, head) the forward walks query blocks and, for each, the key blocks up to the diagonal: scores
// S = Q K^T / sqrt(D) for one tile, an online softmax (running max and sum) and O accumulated against it. Only O
// and the per-row logsumexp are kept; backward recomputes the tiles from them. Memory is O(T), never T x T.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

struct AttentionForward {
  Tensor out;  // (B, T, C), qkv's dtype
  Tensor lse;  // (B, n_head, T): logsumexp of each query row's scaled, masked scores
};

// qkv: (B, T, 3C) f32/f64, C divisible by n_head. f16/bf16 qkv runs the f32 kernel on its exact f32 copy and
// rounds out to qkv's dtype (lse stays f32): the 16-bit attention of mixed precision, f32 accumulation.
AttentionForward causal_attention_forward(const Tensor& qkv, int n_head);

// dout, out: (B, T, C); lse: (B, n_head, T) -> dqkv (B, T, 3C), qkv's dtype.
Tensor causal_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 int n_head);

// ---- argument checks, shared by every backend's entry ----
// The CUDA kernels (ops/cuda/tensor/attention.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<AttentionForward(const Tensor&, int)> causal_attention_forward_device{"causal_attention"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int)>
    causal_attention_backward_device{"causal_attention_backward"};

struct AttentionDims {
  int64_t B, T, C, H, D;
};
inline AttentionDims check_causal_attention(const Tensor& qkv, int n_head) {
  check_float_or_half("causal_attention", "qkv", qkv);
  MINIDL_CHECK(qkv.dim() == 3, "causal_attention: expected qkv of shape (B, T, 3C), got ", qkv.shape());
  MINIDL_CHECK(n_head >= 1, "causal_attention: expected n_head >= 1, got ", n_head);
  int64_t three_c = qkv.size(2);
  MINIDL_CHECK(three_c > 0 && three_c % (3 * int64_t(n_head)) == 0,
               "causal_attention: expected the last dimension of qkv to be 3 * C with C divisible by n_head = ", n_head,
               " (a multiple of ", 3 * n_head, "), got ", three_c, " in qkv of shape ", qkv.shape());
  int64_t C = three_c / 3;
  return {qkv.size(0), qkv.size(1), C, n_head, C / n_head};
}

}  // namespace minidl::ops
