// Causal self-attention on tensor cores for 16-bit inputs, FlashAttention-2 style (flash_attention.cu,
// flash_attention_backward.cu): mma.sync m16n8k16 with f32 accumulation, ldmatrix fragments, K/V (and Q/dO) tiles
// streamed through shared memory with cp.async double buffering, every (batch, head) in one launch, and the key
// tiles above the diagonal never visited. The f32 kernels (attention.cu) stay the path for f32 inputs and for
// head dimensions other than these.
//
//   flash_attention_forward(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
//   flash_attention_backward(dout, qkv, out, lse, dqkv, scratch, B, T, C, n_head, n_kv_head, stream);  // scratch:
//   below
//
// qkv: (B, T, C + 2 n_kv_head D) in ops/attention.h's layout ((B, T, 3C) as GPT-2's c_attn writes it when
// n_kv_head = n_head), C = n_head D, query head h reading kv head h / (n_head / n_kv_head); out, dout: (B, T, C);
// lse: (B, n_head, T) f32,
// the natural-log logsumexp of each row's scaled scores; dqkv (B, T, 3C), every element written, the same bits on
// every run (no atomics; a kv head's dK and dV summed over its query heads in head order). All 16-bit tensors of
// one call have the same type (__half or __nv_bfloat16). Requirements (cudaErrorInvalidValue otherwise): head
// dimension D = C / n_head in {32, 64, 128} (flash_attention_supports), n_head a multiple of n_kv_head, and qkv,
// out, dout and dqkv 16-byte aligned (cp.async moves 16 bytes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

constexpr bool flash_attention_supports(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

cudaError_t flash_attention_forward(const __half* qkv, __half* out, float* lse, int B, int T, int C, int n_head,
                                    int n_kv_head, cudaStream_t stream);
cudaError_t flash_attention_forward(const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse, int B, int T, int C,
                                    int n_head, int n_kv_head, cudaStream_t stream);

// Floats of device scratch flash_attention_backward needs: rowsum(dout * out) per query row and head.
size_t flash_attention_backward_scratch_floats(int B, int T, int n_head);

cudaError_t flash_attention_backward(const __half* dout, const __half* qkv, const __half* out, const float* lse,
                                     __half* dqkv, float* scratch, int B, int T, int C, int n_head, int n_kv_head,
                                     cudaStream_t stream);
cudaError_t flash_attention_backward(const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                     const float* lse, __nv_bfloat16* dqkv, float* scratch, int B, int T, int C,
                                     int n_head, int n_kv_head, cudaStream_t stream);

}  // namespace minidl::ops::cuda
