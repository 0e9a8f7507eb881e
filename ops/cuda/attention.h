// The host launchers of attention.cu and attention_backward.cu on raw device pointers (library minidl_cuda_kernels,
// nvcc; or minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry
// checks shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is
// enqueued on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- attention.cu: ops::causal_attention_forward (f32) ----
// qkv: (B, T, C + 2 n_kv_head D) in ops/attention.h's layout (n_kv_head = n_head: (B, T, 3C) as GPT-2's c_attn
// writes it), C = n_head D; head dimension D = C / n_head must be 16, 32 or 64 and n_head a multiple of n_kv_head
// (cudaErrorInvalidValue otherwise). out: (B, T, C), lse: (B, n_head, T).
cudaError_t causal_attention_forward(const float* qkv, float* out, float* lse, int B, int T, int C, int n_head,
                                     int n_kv_head, cudaStream_t stream);

// ---- attention_backward.cu: ops::causal_attention_backward (f32) ----
// Floats of device scratch that causal_attention_backward needs (rowsum(dout * out) per query row and head).
size_t causal_attention_backward_scratch_floats(int B, int T, int n_head);
// dout, out: (B, T, C); lse: (B, n_head, T) from the forward -> dqkv in qkv's layout, every element overwritten,
// the same bits on every run (no atomics; a kv head's dK and dV summed over its query heads in head order). Same
// head dimensions and heads as the forward.
cudaError_t causal_attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                                      float* dqkv, float* scratch, int B, int T, int C, int n_head, int n_kv_head,
                                      cudaStream_t stream);

}  // namespace minidl::ops::cuda
