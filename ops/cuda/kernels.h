// Host launchers of minidl's hand-written CUDA kernels (ops/cuda/*.cu), on raw device pointers.
//
// Library minidl_cuda_kernels builds them with nvcc for CMAKE_CUDA_ARCHITECTURES; minidl_cuda_kernels_emu builds
// the same sources with the host compiler against the CPU emulator of CUDA (cuda_emu/), which is how the tests
// execute them. Each computes what the CPU op named beside it computes (same ops/kernels/ math, f32 only), and
// validates nothing: the op's entry checks shapes, dtypes and devices first. Every launcher enqueues its kernels
// on `stream` and returns the first launch error (cudaSuccess when all launched; faults inside a kernel surface
// at the next synchronising call, as usual in CUDA).
//
//   float* scratch;  // cudaMalloc'd, layernorm_backward_scratch_floats(rows, C) floats
//   CUDA_CHECK(layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, scratch, rows, C, stream));
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops::cuda {

// ---- layernorm.cu: ops::layernorm_forward / layernorm_backward ----
// x, y: (rows, C) row-major; weight, bias: (C); mean, rstd: (rows), rstd = 1 / sqrt(var + eps).
cudaError_t layernorm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                              float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
// Floats of device scratch that layernorm_backward needs for its dweight/dbias partial sums.
size_t layernorm_backward_scratch_floats(int64_t rows, int C);
// dy, x, dx: (rows, C); weight, dweight, dbias: (C); mean, rstd as the forward saved them. dweight and dbias are
// overwritten (not accumulated into), with the same bits on every run and every GPU.
cudaError_t layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                               const float* rstd, float* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);

// ---- bias_gelu.cu: ops::bias_gelu_forward / bias_gelu_backward ----
// x, y: (rows, C); bias: (C); y = gelu(x + bias), tanh approximation (ops/kernels/gelu.h).
cudaError_t bias_gelu_forward(const float* x, const float* bias, float* y, int64_t rows, int C,
                              cudaStream_t stream);
// Floats of device scratch that bias_gelu_backward needs for its dbias partial sums.
size_t bias_gelu_backward_scratch_floats(int64_t rows, int C);
// dx = dy * gelu'(x + bias); dbias (C) = dx summed over rows, overwritten, deterministic.
cudaError_t bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, float* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);

// ---- adamw.cu: ops::fused_adamw_ over many tensors at once ----
// One parameter's flat buffers of n floats each (param, m, v updated in place).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
};
// One AdamW step for every tensor of the list, in as few launches as the kernel's parameter space allows (one
// for up to 36 tensors and 320 chunks of 64 Ki elements). `constants` from kernels::adamw_constants(..., step).
cudaError_t fused_adamw(const AdamWTensor* tensors, int count, const minidl::kernels::AdamWConstants& constants,
                        cudaStream_t stream);

// ---- unscale.cu: ops::unscale_and_check_ ----
// grad (n floats) *= inv_scale in place; sets *found_inf to 1 if any result is inf or NaN, and leaves it alone
// otherwise, so one flag (zeroed by the caller) collects every gradient of a step without a host round trip.
cudaError_t unscale_and_check(float* grad, int64_t n, float inv_scale, int* found_inf, cudaStream_t stream);

}  // namespace minidl::ops::cuda
