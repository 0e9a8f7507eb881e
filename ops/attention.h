// Fused causal self-attention, flash style (Dao et al., 2022), without autograd, with grouped-query heads.
//
//   auto [y, lse] = ops::causal_attention_forward(qkv, n_head);         // qkv: (B, T, 3C) -> y: (B, T, C)
//   Tensor dqkv = ops::causal_attention_backward(dy, qkv, y, lse, n_head);
//   auto [y2, lse2] = ops::causal_attention_forward(qkv2, 8, 2);        // qkv2: (B, T, (8 + 2 * 2) D), GQA
//
// qkv is the fused projection's output: with H = n_head query heads, Hkv = n_kv_head key/value heads and head
// dimension D (the last dimension is (H + 2 Hkv) D), along it q = [0, H D), k = [H D, (H + Hkv) D) and
// v = [(H + Hkv) D, (H + 2 Hkv) D), and within each of them head h takes columns [h D, (h + 1) D). Hkv = H (the
// default) is GPT-2's c_attn layout, q = [0, C), k = [C, 2C), v = [2C, 3C), D = C / n_head. Hkv < H is grouped-query
// attention (Hkv = 1: multi-query): H is a multiple of Hkv, and query head h reads key/value head h / (H / Hkv), so
// heads [g j, g j + g) share kv head j (g = H / Hkv; Hugging Face's repeat_kv order). K and V are never repeated in
// memory; the backward sums a kv head's gradient over its group's query heads. The output (B, T, H D) has the
// query heads merged the same way.
// Per (batch, head) the forward walks query blocks and, for each, the key blocks up to the diagonal: scores
// S = Q K^T / sqrt(D) for one tile, an online softmax (running max and sum) and O accumulated against it. Only O
// and the per-row logsumexp are kept; backward recomputes the tiles from them. Memory is O(T), never T x T.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

struct AttentionForward {
  Tensor out;  // (B, T, H D), qkv's dtype
  Tensor lse;  // (B, n_head, T): logsumexp of each query row's scaled, masked scores
};

// qkv: (B, T, (n_head + 2 n_kv_head) D) f32/f64, n_head a multiple of n_kv_head. f16/bf16 qkv runs the f32 kernel
// on its exact f32 copy and rounds out to qkv's dtype (lse stays f32): the 16-bit attention of mixed precision,
// f32 accumulation.
AttentionForward causal_attention_forward(const Tensor& qkv, int n_head, int n_kv_head);
inline AttentionForward causal_attention_forward(const Tensor& qkv, int n_head) {
  return causal_attention_forward(qkv, n_head, n_head);
}

// dout, out: (B, T, H D); lse: (B, n_head, T) -> dqkv in qkv's shape and dtype.
Tensor causal_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 int n_head, int n_kv_head);
inline Tensor causal_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                        int n_head) {
  return causal_attention_backward(dout, qkv, out, lse, n_head, n_head);
}

// ---- argument checks, shared by every backend's entry ----
// The CUDA kernels (ops/cuda/tensor/attention.cpp), filled by minidl::cuda::register_backend(); (qkv, n_head,
// n_kv_head) as above.
inline DeviceKernel<AttentionForward(const Tensor&, int, int)> causal_attention_forward_device{"causal_attention"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int)>
    causal_attention_backward_device{"causal_attention_backward"};

struct AttentionDims {
  int64_t B, T, C, H, D, Hkv;                        // C = H D: the width of q and of the output
  int64_t group() const { return H / Hkv; }          // query heads per kv head
  int64_t width() const { return C + 2 * Hkv * D; }  // qkv's row: (H + 2 Hkv) D
};
inline AttentionDims check_causal_attention(const Tensor& qkv, int n_head, int n_kv_head) {
  check_float_or_half("causal_attention", "qkv", qkv);
  MINIDL_CHECK(qkv.dim() == 3,
               "causal_attention: expected qkv of shape (B, T, 3C), or (B, T, (n_head + 2 * n_kv_head) * head_dim) "
               "with grouped kv heads, got ",
               qkv.shape());
  MINIDL_CHECK(n_head >= 1, "causal_attention: expected n_head >= 1, got ", n_head);
  MINIDL_CHECK(n_kv_head >= 1 && n_head % n_kv_head == 0,
               "causal_attention: expected n_head to be a multiple of n_kv_head (each kv head serving a group of "
               "query heads), got n_head = ",
               n_head, " and n_kv_head = ", n_kv_head);
  const int64_t width = qkv.size(2), heads = int64_t(n_head) + 2 * int64_t(n_kv_head);
  MINIDL_CHECK(width > 0 && width % heads == 0,
               "causal_attention: expected the last dimension of qkv to be (n_head + 2 * n_kv_head) * head_dim with "
               "n_head = ",
               n_head, " and n_kv_head = ", n_kv_head, " (a multiple of ", heads, "), got ", width, " in qkv of shape ",
               qkv.shape());
  const int64_t D = width / heads;
  return {qkv.size(0), qkv.size(1), n_head * D, n_head, D, n_kv_head};
}

}  // namespace minidl::ops
