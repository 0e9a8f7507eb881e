// Host entry points of the tensor-core primitive test kernels (tensor_core_kernels.cu), built with nvcc
// (cuda_emu_nvcc_check) and against the emulator (test_tensor_core.cpp). Pointers are device pointers; each
// function returns its launch's error.
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace emu_test {

// One warp, one mma_m16n8k16<T>: d (16x8 f32, row-major) = a (16x16 row-major) * b (16x8 row-major) + c, each
// lane reading its fragments straight from global memory by the PTX ISA's layout.
cudaError_t mma_tile_f16(const __half* a, const __half* b, const float* c, float* d);
cudaError_t mma_tile_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d);

// One warp: `in` (4 consecutive 8x8 matrices of 16-bit values, 256 of them) is stored to shared memory, then
// ldmatrix<matrices> (transposed if `trans`) with lane l pointing at row l % 8 of matrix l / 8;
// out[lane * 4 + m] = the lane's register m (m < matrices).
cudaError_t ldmatrix_lanes(const uint16_t* in, uint32_t* out, int matrices, bool trans);

// One block of 64 threads: thread i copies 16 bytes (in[4i..4i+3]) to shared memory with cp_async_16 in group
// i % 2 (group 0 committed first), then, if `wait_groups` >= 0, cp_async_wait<wait_groups>() (0 or 1); then a
// barrier and out = the shared memory.
cudaError_t async_copy_groups(const float* in, float* out, int wait_groups);

// One warp: d (16x8 f32) = a (16x16, row-major) * b (16x8) through shared memory: a and b loaded with cp.async,
// a's fragments with ldmatrix<4>; b_layout 0: b given as (8, 16) row-major (n, k), fragments with ldmatrix<2>;
// 1: b given as (16, 8) row-major (k, n), fragments with ldmatrix_trans<2>.
cudaError_t smem_mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, int b_layout);

}  // namespace emu_test
