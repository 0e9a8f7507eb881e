// Host launchers of dist's CUDA kernels (dist/cuda/reduce.cu) on raw device pointers: the ring's local
// reduction step and kAvg's division, the GPU twins of dist/reduce.h's CPU loops.
//
// Library minidl_dist_cuda_kernels builds them with nvcc; minidl_dist_cuda_kernels_emu with the host compiler
// against the CPU emulator of CUDA (as ops/cuda/ does), which is how the tests run them. Like every launcher they
// validate nothing, enqueue on `stream` and return the launch's error.
//
//   MINIDL_CUDA_CHECK(combine_into(ElementType::kF32, Combine::kSum, dst, src, n, stream));  // dst += src
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::dist::cuda_kernels {

// The dtypes a collective reduces (f16/bf16 are staged through f32 first: see dist/process_group.h).
enum class ElementType { kF32, kF64, kI32, kI64, kU8 };
enum class Combine { kSum, kMax };

// dst[i] = dst[i] + src[i] (kSum) or max(dst[i], src[i]) (kMax, keeping dst on ties and when src is NaN, as the
// CPU loop and MPI_MAX do), for i < n. dst and src do not overlap.
cudaError_t combine_into(ElementType type, Combine combine, void* dst, const void* src, int64_t n, cudaStream_t stream);

// data[i] = data[i] / divisor: true division for floats, truncation toward zero for integers.
cudaError_t divide_by(ElementType type, void* data, int64_t n, int divisor, cudaStream_t stream);

}  // namespace minidl::dist::cuda_kernels
