// Differentiable operations: each validates its inputs, calls the forward kernel in ops/, and records a backward
// (written next to it) when an input requires grad. This is the API models are written in. Inside an
// AutocastGuard they follow the mixed-precision policy of autograd/autocast.h.
//
//   Tensor h = layernorm(x, ln.weight, ln.bias);          // x: (B, T, C)
//   Tensor qkv = linear(h, c_attn.weight, c_attn.bias);  // (B, T, 3C), weight (C, 3C) as in HF GPT-2
//   Tensor y = causal_attention(qkv, n_head);             // (B, T, C)
//   Tensor loss = cross_entropy(logits.view({B*T, V}), targets.view({B*T}));
//   loss.backward();
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"

namespace minidl {

// ---- elementwise, NumPy broadcasting (autograd/functions/elementwise.cpp) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor square(const Tensor& a);
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- reductions (autograd/functions/reduce.cpp) ----
Tensor sum(const Tensor& x);  // all elements -> scalar
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x, int dim, bool keepdim = false);  // values; gradient to the first maximum
// The parts joined along dim (each of the others' sizes equal): a new contiguous tensor; each part's gradient is
// its slice of the output's.
Tensor cat(std::initializer_list<Tensor> parts, int dim);
Tensor cat(const std::vector<Tensor>& parts, int dim);

// ---- linear algebra (autograd/functions/matmul.cpp) ----
// a: (..., M, K) or (..., K, M) if trans_a; b: (..., K, N) or (..., N, K) if trans_b; leading (batch)
// dimensions must match, or b may be 2-D (shared across the batch). Transposes are folded into the BLAS call.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x: (..., in), weight: (in, out) (Hugging Face GPT-2 "Conv1D" layout), bias: (out) or undefined -> x @ W + b.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// The GPT MLP, linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias), as one node whose forward and
// backward put the GELU in a GEMM's epilogue on a CUDA device (autograd/functions/mlp.cpp, ops/linear_gelu.h).
// x: (..., C); fc_weight: (C, H); fc_bias: (H) or undefined; proj_weight: (H, C); proj_bias: (C) or undefined.
Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias);

// ---- neural-network ops (autograd/functions/nn.cpp) ----
// weight: (V, C); ids: integer tensor of any shape -> (*ids.shape, C).
Tensor embedding(const Tensor& weight, const Tensor& ids);
// Fused layer norm over the last dimension. weight, bias: (C).
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// The residual add fused into the layer norm that reads it: sum = a + b and y = layernorm(sum) in one kernel each
// way (the GPT block's residual stream feeding ln_2), the same arithmetic as `a + b` then layernorm. a, b: (..., C).
struct AddLayerNorm {
  Tensor sum;  // a + b
  Tensor y;    // layernorm(sum)
};
AddLayerNorm add_layernorm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                           double eps = 1e-5);
// Fused RMS norm over the last dimension (Llama's, ops/rmsnorm.h): xhat = x * rsqrt(mean(x^2) + eps) in f32, cast
// to x's dtype, then times weight (C). eps from the model's config: no default.
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps);
// Rotary position embedding, rotate_half layout (ops/rope.h). x: (B, T, H, D), the heads of attention's q or k;
// cos, sin: (P, D / 2) tables (ops::rope_tables) on x's device, rows [position_offset, position_offset + T) used.
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset = 0);
// Llama's MLP activation silu(gate) * up (ops/swiglu.h); gate, up: the same shape.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// GELU, tanh approximation (as GPT-2).
Tensor gelu(const Tensor& x);
// Fused gelu(x + bias); bias: (C) broadcast over the last dimension.
Tensor bias_gelu(const Tensor& x, const Tensor& bias);
// Softmax over the last dimension (the unfused reference path; the model uses the fused ops below).
Tensor softmax(const Tensor& x);
// Fused softmax + cross-entropy. logits: (N, Vp); targets: (N) integer. Mean (or sum) over targets != ignore_index.
// classes: the real V <= Vp (columns [V, Vp) are padding: outside the softmax, zero gradient); -1: all columns.
// 16-bit logits are read as they are (f32 math, f32 loss; on the CPU through an f32 copy inside the op). Backward
// writes dlogits over the logits when nothing but this node holds them (e.g. the head's matmul output, dropped by
// the caller): nothing can read the overwritten values.
using ops::Reduction;
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -1,
                     Reduction reduction = Reduction::kMean, int64_t classes = -1);
// Fused causal self-attention, flash style (blocked, online softmax, no T x T matrix kept for backward).
// qkv: (B, T, 3C) with q, k, v in that order along the last dimension; heads split C -> (n_head, C / n_head).
// Returns (B, T, C) with heads merged. With n_kv_head < n_head (grouped-query attention, n_head a multiple of it),
// qkv is (B, T, (n_head + 2 n_kv_head) D): n_head query heads, then n_kv_head key and n_kv_head value heads, query
// head h reading kv head h / (n_head / n_kv_head); returns (B, T, n_head D). Layout: ops/attention.h.
Tensor causal_attention(const Tensor& qkv, int n_head, int n_kv_head);
inline Tensor causal_attention(const Tensor& qkv, int n_head) { return causal_attention(qkv, n_head, n_head); }
// Inverted dropout with probability p. The mask for element i is Philox(seed, stream).uniform(offset + i...),
// so it is reproducible and identical on every device. Identity when p == 0.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset);
// The same with a step read on x's device when the kernels run (ops::DropoutStep: counter offset + step * per step);
// backward reads it again, so it must not change between a forward and its backward.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset,
               const ops::DropoutStep& step);

// ---- convolution and pooling, channels last (autograd/functions/conv.cpp; layouts in ops/conv.h) ----
// x: (N, H, W, C), weight: (K, R, S, C), bias: (K) or undefined -> (N, P, Q, K) with
// P = (H + 2 padding - dilation (R - 1) - 1) / stride + 1 (likewise Q). Zero padding, cross-correlation.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride = 1, int64_t padding = 0,
              int64_t dilation = 1);
// Max over kernel x kernel windows: x (N, H, W, C) -> (N, (H - kernel) / stride + 1, (W - kernel) / stride + 1, C).
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride);

}  // namespace minidl
