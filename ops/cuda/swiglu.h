// The host launchers of swiglu.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the launch error (cudaSuccess when launched); work is enqueued on
// `stream`.
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- swiglu.cu: ops::swiglu_forward / swiglu_backward ----
// gate, up, y, dy, dgate, dup: n elements each, one storage type (f32, f16 or bf16; math in f32, each result
// rounded once). y = silu(gate) * up; dgate, dup = its partial derivatives times dy (ops/kernels/swiglu.h). One
// launch each.
#define MINIDL_SWIGLU_LAUNCHERS(T)                                                                  \
  cudaError_t swiglu_forward(const T* gate, const T* up, T* y, int64_t n, cudaStream_t stream);     \
  cudaError_t swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, \
                              cudaStream_t stream);
MINIDL_SWIGLU_LAUNCHERS(float)
MINIDL_SWIGLU_LAUNCHERS(__half)
MINIDL_SWIGLU_LAUNCHERS(__nv_bfloat16)
#undef MINIDL_SWIGLU_LAUNCHERS

}  // namespace minidl::ops::cuda
