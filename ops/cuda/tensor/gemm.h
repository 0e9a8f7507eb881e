// The GEMM of the CUDA backend, on raw device pointers: cuBLAS in minidl_cuda_backend (gemm_cublas.cpp), the
// CPU's OpenBLAS on the emulated device's host memory in minidl_cuda_backend_emu (gemm_host.cpp). Row-major, as
// the CPU op: C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, op(A): (M, K), op(B): (K, N), C: (M, N).
// A batch stride of 0 shares an operand across the batch. Operands are f32, f16 or bf16 (all three the same;
// C has their dtype), with f32 accumulation: 16-bit operands run on tensor cores; f32 uses TF32 tensor cores
// only when set_allow_tf32(true) (ops/matmul.h) asked for it. Work is queued on `stream`.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

struct GemmOperand {
  const void* ptr;
  int64_t ld;            // leading dimension of the stored (untransposed) row-major matrix
  int64_t batch_stride;  // elements between consecutive batch entries; 0 = shared
  bool trans;
};

void gemm(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
          const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc, int64_t c_batch_stride);

// As gemm, with C in f32 whatever A and B are (f32, f16 or bf16, the two the same): 16-bit products accumulated
// in f32 and written (or, with beta = 1, accumulated) without rounding to 16 bits. cublasGemmStridedBatchedEx with
// an f32 C in the real backend. ops::matmul_f32: the weight gradients of mixed precision.
void gemm_f32_out(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K,
                  float alpha, const GemmOperand& A, const GemmOperand& B, float beta, float* C, int64_t ldc,
                  int64_t c_batch_stride);

// Loads the GEMM library now (cuBLAS and cuBLASLt, opened on first use in the real backend) and checks every
// function minidl calls is there; throws naming the library or function otherwise. Nothing to do when emulated.
void load_gemm_library();

// linear's product with its bias added in the GEMM's epilogue: out (rows, n) = x (rows, k) w (k, n) + bias (n),
// all contiguous, row-major, of `dtype`. cuBLASLt's CUBLASLT_EPILOGUE_BIAS in the real backend; returns false
// (nothing done) where no fused epilogue is available (the emulated backend, or a shape cuBLASLt has no algorithm
// for), and the caller adds the bias itself.
bool gemm_bias(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
               const void* w, const void* bias, void* out);

// The GPT MLP's GELU in the GEMM's epilogue (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD in the real backend; the
// same arithmetic on the host after OpenBLAS in the emulated one). All operands contiguous, row-major, of `dtype`
// (f32, f16 or bf16), f32 accumulation; GELU is the tanh form of ops/kernels/gelu.h, applied to the f32 value.
// Both return false (nothing done) where cuBLASLt has no algorithm for the shape or an operand breaks its layout
// rules (n not a multiple of 8, an unaligned pointer): the caller then runs the unfused GEMM and kernels.
//
// Forward: pre = x (rows, k) w (k, n) [+ bias (n)]; aux (rows, n) = pre, saved for backward; out (rows, n) =
// gelu(pre). bias == nullptr: no bias (GELU_AUX).
bool gemm_bias_gelu(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
                    const void* w, const void* bias, void* out, void* aux);

// Backward, in the GEMM that makes the GELU's output gradient (c_proj's input gradient): dh = dy (rows, k) w^T,
// w (n, k) row-major (c_proj's weight, in = n, out = k); dpre (rows, n) = dh * gelu'(aux); dbias (n) = dpre summed
// over rows in f32 (fixed order, no atomics) and rounded once. dbias == nullptr: no bias gradient (DGELU).
bool gemm_dgelu_bgrad(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* dy,
                      const void* w, const void* aux, void* dpre, void* dbias);

// linear's weight and bias gradients in one GEMM (cuBLASLt's BGRADA in the real backend; the same sums on the host
// after OpenBLAS in the emulated one): dw (k, n) = x^T dy, x (rows, k) and dy (rows, n) contiguous, row-major, of
// `dtype`; dbias (n) = dy summed over rows in f32 (fixed order, no atomics) and rounded once. dw and dbias are of
// `out_dtype`: dtype, or f32 (16-bit x and dy: mixed precision's f32 gradients, as gemm_f32_out). Returns false
// (nothing done) where cuBLASLt has no algorithm for the shape: the caller then runs the GEMM and the sum.
bool gemm_wgrad_bgrad(int device, cudaStream_t stream, DType dtype, DType out_dtype, int64_t rows, int64_t k, int64_t n,
                      const void* x, const void* dy, void* dw, void* dbias);

}  // namespace minidl::ops::cuda
