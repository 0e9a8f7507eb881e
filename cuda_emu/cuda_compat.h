// cuda_compat.h — the one header a minidl kernel includes, so the same source builds in two worlds:
//
//   nvcc (__CUDACC__)   the real CUDA runtime: <cuda_runtime.h>, <cuda_fp16.h>, <cuda_bf16.h>.
//   host compiler       the CPU emulation of the CUDA execution model (cuda_emu/emulator.h, library
//                       minidl_cuda_emu): blocks on worker threads, the threads of a block as fibers,
//                       counted barriers, warp collectives, atomics, and a host-memory runtime subset.
//
// Shared kernel code uses three helpers instead of CUDA constructs a host compiler cannot parse or the
// emulator cannot check:
//
//   launch_kernel(kernel, grid, block, smem_bytes, stream, args...)   instead of kernel<<<...>>>(args...)
//   dynamic_smem<T>()                                                 instead of extern __shared__ T buf[]
//   MINIDL_SHARED(T, name, [N][M]);                                   instead of __shared__ T name[N][M];
//
// MINIDL_SHARED declares a static shared array (or, with empty dims, `MINIDL_SHARED(float, total, );`, one
// value) inside a kernel or device function. Under nvcc it is exactly the __shared__ declaration. Under the
// emulator the array is filled with 0xFF bytes (NaN for f32/f16/bf16) for each block, like dynamic shared
// memory, so reading what no thread of this block wrote shows up, and the block's total is checked against
// 48 KiB; a raw __shared__ still compiles there (thread_local) but keeps the previous block's values. minidl's
// kernels (ops/cuda, dist/cuda) must use the macro: tests/cuda_emu/test_sources.cpp enforces it. One type
// name without commas, dims in brackets; namespace-scope __shared__ variables have no equivalent.
//
// launch_kernel returns the launch's error (cudaGetLastError() right after the launch, which also clears it),
// so callers put it under their CUDA status check. Each call adds one to minidl_kernel_launches(), which the
// CUDA backend reports in its counters (core/cuda/cuda.h: cuda::counters()), under nvcc and the emulator alike. Under
// nvcc that is a configuration error (too many threads, too much dynamic shared memory); the kernel itself runs
// asynchronously. Under the emulator the kernel has finished when it returns.
//
//   #include "cuda_emu/cuda_compat.h"
//
//   __global__ void scale(float* x, float a, int n) {
//     int i = blockIdx.x * blockDim.x + threadIdx.x;
//     if (i < n) x[i] *= a;
//   }
//   cudaError_t scale_async(float* x, float a, int n, cudaStream_t s) {
//     return launch_kernel(scale, (n + 255) / 256, 256, 0, s, x, a, n);
//   }
//
// Rules for code that must run in both worlds (what the emulator checks is in emulator.h):
// every thread of a block reaches the same __syncthreads (guard work, don't return early before a barrier);
// warp code uses *_sync intrinsics with explicit masks; tensor-core mma (m16n8k16 f16/bf16), ldmatrix and
// cp.async go through cuda_emu/tensor_core.h, which the emulator models; no other inline PTX, wgmma, TMA,
// clusters or grid-wide sync in a kernel the emulator must run (a fast path like that lives in its own .cu file
// next to a portable kernel for the same op).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "cuda_emu/launch_count.h"

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// One extern __shared__ array of one type for the whole program: nvcc rejects the same name declared with
// different element types, so every T views the same aligned bytes.
template <class T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char minidl_dynamic_smem[];
  return reinterpret_cast<T*>(minidl_dynamic_smem);
}

#define MINIDL_SHARED(type, name, dims) __shared__ type name dims

// The launch's own error; arguments convert to the kernel's parameter types as with <<<>>>.
template <class... Params, class... Args>
[[nodiscard]] cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                        cudaStream_t stream, Args&&... args) {
  minidl_kernel_launches().fetch_add(1, std::memory_order_relaxed);
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

#else

#include "cuda_emu/emulator.h"

template <class T>
inline T* dynamic_smem() {
  return reinterpret_cast<T*>(minidl::emu::detail::dynamic_smem_base());
}

// `name` is a reference to storage the emulator poisons per block. The lambda gives every declaration site
// (and every instantiation of a template around it) its own per-worker StaticSmemSite; type_identity_t spells
// "type dims" as one type, with or without dims.
#define MINIDL_SHARED(type, name, dims)                                                                                \
  std::type_identity_t<type dims>& name = *[] {                                                                        \
    static thread_local ::minidl::emu::detail::StaticSmemSite minidl_site;                                             \
    return reinterpret_cast<std::type_identity_t<type dims>*>(                                                         \
        ::minidl::emu::detail::static_smem(minidl_site, sizeof(type dims), alignof(type), #name, __FILE__, __LINE__)); \
  }()

template <class... Params, class... Args>
[[nodiscard]] cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                        cudaStream_t stream, Args&&... args) {
  minidl_kernel_launches().fetch_add(1, std::memory_order_relaxed);
  minidl::emu::launch(kernel, grid, block, smem_bytes, stream, std::forward<Args>(args)...);
  return cudaGetLastError();
}

#endif
