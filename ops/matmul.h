// Matrix products (no autograd): f32 on minidl's own kernel (simd::gemm_sum) or OpenBLAS's sgemm (set_cpu_gemm
// below), f64 on dgemm, with transposes folded into the call. f16/bf16 operands are multiplied as their exact f32
// copies with f32 accumulation, and the result is rounded to their dtype.
//
//   Tensor y = ops::matmul(x, w);                          // x: (B, T, C), w: (C, N) -> (B, T, N), one GEMM
//   Tensor s = ops::matmul(q, k, false, /*trans_b=*/true); // (B, H, T, D) x (B, H, T, D)^T -> (B, H, T, T)
//
// An operand that is a transposed view of contiguous memory (x.transpose(-1, -2)) is passed to the kernel as is,
// with the transpose flag flipped; other strided operands are copied to contiguous memory first.
//
// Threads: a large 2-D product is split into row (or column) blocks of the output, one per thread, or, when the
// reduction is the longest dimension (weight gradients), into partial products over the reduction that are then
// summed (OpenBLAS: one per thread; minidl's kernel: two fixed halves); each thread calls the single-threaded
// kernel (the OpenMP OpenBLAS runs serially inside a parallel region).
// For the shapes of a small GPT on 2 cores this beats OpenBLAS's own threading (see matmul.cpp). Batched
// products run one batch entry per thread.
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// op(a) . op(b) where op transposes the last two dimensions when its flag is set.
// a: (..., M, K), or (..., K, M) if trans_a; b: (..., K, N), or (..., N, K) if trans_b. The leading (batch)
// dimensions must be equal, or one operand 2-D (shared across the other's batch). Returns (..., M, N).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// out += op(a) . op(b), out contiguous of the product's shape, dtype and device. On the CPU in f32 and f64 the
// product is summed onto out by the GEMM (beta = 1; autograd's gradient-accumulation fusion: a weight gradient
// added straight into .grad()); elsewhere out is added a fresh product (ops::add_).
void matmul_add_(Tensor& out, const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// A linear layer's weight and bias gradients on the CPU in f32, from its input rows x2 (rows, in) and output
// gradient dy2 (rows, out): dw = x2^T dy2 (accumulate: dw += x2^T dy2, as matmul_add_) and dbias = dy2 summed over
// rows, each column's rows added in order (ops::sum(dy2, 0)'s bits). Where the product splits the reduction into
// halves (the usual weight-gradient shape) the sums run in the product's own parallel region, after it, the
// columns split among the threads: no region and no fork of their own. dw (in, out) and dbias (out) contiguous f32.
void linear_weight_bias_grad_into(Tensor& dw, Tensor& dbias, const Tensor& x2, const Tensor& dy2, bool accumulate);

// op(a) . op(b) in f32: for 16-bit a and b (one dtype) the f32 accumulation is written out without being rounded
// to 16 bits (on a GPU, a GEMM with 16-bit inputs and an f32 output). Mixed precision's gradients of f32 tensors
// (the weights) come from it: summed in f32 by the GEMM itself, not produced in 16 bits and then cast. f32 and
// f64 operands: matmul().
Tensor matmul_f32(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// x . weight + bias. x: (..., in); weight: (in, out); bias: (out) or undefined. Returns (..., out).
// The bias is written into the output and BLAS accumulates onto it (beta = 1), saving a pass; on the CPU each
// thread writes the bias into its own block of the output just before its share of the product.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// The CPU BLAS calls that matmul, matmul_f32 and linear make (every product of a CPU training step but attention's
// tiles): their thread time and FLOPs, summed over the threads that make them, while counting is on. Off by
// default, when a call costs one relaxed load; count_blas(true) starts again from zero. bench_gpt_step splits a
// step with it into the time in BLAS, at what rate, and the rest. Products matmul splits over threads call BLAS
// single-threaded; one it leaves whole (under 2^21 FLOPs, or too narrow) counts its wall time once even if
// OpenBLAS threads it.
struct BlasCount {
  double seconds = 0;  // thread time inside BLAS
  double flops = 0;    // 2 M N K per call
};
void count_blas(bool on);
BlasCount blas_count();

// Validates a product like matmul() does and returns its output shape (..., M, N).
Shape matmul_output_shape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// Which code multiplies f32 matrices on the CPU: kAuto (the default) is minidl's own kernel (ops/cpu/simd/
// tile_gemm.cpp's gemm_sum) when the vector code runs AVX2 or AVX-512 (MINIDL_CPU_ISA), OpenBLAS under SSE4;
// kOpenBlas and kMinidl force one. f64 always goes to BLAS. cpu_gemm() says which one runs now.
// The own kernel's bits do not depend on the thread count: each element is one running sum over k, and a weight
// gradient (the reduction the longest dimension) is summed in two fixed halves on any number of threads. OpenBLAS's
// weight gradients are summed in one partial product per thread, so theirs do.
enum class CpuGemm { kAuto, kOpenBlas, kMinidl };
void set_cpu_gemm(CpuGemm gemm);
CpuGemm cpu_gemm();

// Whether f32 products on a GPU may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation; about 1e-3
// relative error). Off by default, as in PyTorch; the CPU ignores it.
void set_allow_tf32(bool allow);
bool allow_tf32();

// The CUDA kernels (ops/cuda/tensor/matmul.cpp), filled by minidl::cuda::register_backend(). linear_device takes
// x as validated 2-D rows (rows, in) and returns (rows, out).
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, bool, bool)> matmul_device{"matmul"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&)> linear_device{"linear"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, bool, bool)> matmul_f32_device{"matmul_f32"};

}  // namespace minidl::ops
