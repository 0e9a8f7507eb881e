// MINIDL_CUDA_CHECK(call): runs a CUDA runtime call once; on failure throws minidl::Error with CUDA's error name
// and text, the call, the rank (when the process is part of a job) and file:line:
//
//   MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
//   -> "cudaMalloc(&p, bytes) failed on rank 1: out of memory (cudaErrorMemoryAllocation) (core/cuda/allocator.cpp:52)"
//
// It comes from the same generator as MINIDL_MPI_CHECK (MINIDL_STATUS_CHECK in core/error.h).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace minidl::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
}  // namespace minidl::cuda::detail

#define MINIDL_CUDA_CHECK(call) MINIDL_STATUS_CHECK(call, #call, cudaSuccess, ::minidl::cuda::detail::throw_cuda_error)
