// The host launchers of attention_blocks.cu on raw device pointers (ops/attention_blocks.h's device kernels; library
// minidl_cuda_kernels, nvcc, or minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates
// nothing: the op's entry checks shapes, dtypes and devices first. f32, contiguous; work is enqueued on `stream`.
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// One query block q (B, Tq, H D) against one key/value block k, v (B, Tk, Hkv D): out (B, Tq, H D) normalised,
// lse (B, H, Tq). causal: the diagonal block (Tq = Tk, query i sees keys 0..i).
cudaError_t attention_block_forward(const float* q, const float* k, const float* v, float* out, float* lse, int64_t B,
                                    int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, bool causal,
                                    cudaStream_t stream);
// The block's share of dq (B, Tq, H D) and its dk, dv (B, Tk, Hkv D), from the row's merged out and lse; delta
// (B, H, Tq) is scratch (rowsum(dout * out)).
cudaError_t attention_block_backward(const float* dout, const float* q, const float* k, const float* v,
                                     const float* out, const float* lse, float* delta, float* dq, float* dk, float* dv,
                                     int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, bool causal,
                                     cudaStream_t stream);
// out (B, T, H D), lse (B, H, T) merged in place with a block's out_b, lse_b (the online softmax's log-sum-exp).
cudaError_t merge_attention_blocks(float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t T,
                                   int64_t H, int64_t D, cudaStream_t stream);

}  // namespace minidl::ops::cuda
