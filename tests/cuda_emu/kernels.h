// Host entry points of the emulator's test kernels (kernels.cu). The same kernels build with nvcc
// (target cuda_emu_nvcc_check) and with the host compiler against the emulator (the tests).
// Pointers are device pointers (cudaMalloc); each function returns its launch's error.
#pragma once

#include "cuda_emu/cuda_compat.h"

namespace emu_test {

struct AtomicResults {
  int count;                 // +1 per thread
  unsigned long long big;    // +2^33 per thread
  int max, min;              // of a scrambled per-thread value
  float fsum;                // +0.1 * (i % 10) per thread
  double dsum;               // +0.5 * (i % 4) per thread
  int cas;                   // +1 per thread through an atomicCAS loop
  unsigned flag, exch_hits;  // exactly one thread finds flag == 0 with atomicExch
};

// ---- kernels written correctly ----
// out[b] = sum of in[b*threads, (b+1)*threads) ∩ [0, n): shared-memory tree reduction, any block size.
cudaError_t block_sums(const float* in, int n, float* out, int threads);
// out[w] = sum over global warp w (partial warps included): __shfl_down_sync with the warp's real lanes.
cudaError_t warp_sums(const float* in, int n, float* out, int threads);
// out[i] = sum of in over i's segment of `width` lanes (n a multiple of 32): __shfl_xor_sync with width.
cudaError_t segment_sums(const int* in, int* out, int n, int width);
// out = inclusive prefix sum within each warp of each block of `threads`: __shfl_up_sync, partial warps.
cudaError_t warp_scans(const int* in, int* out, int n, int threads);
// One warp; lanes 0-15 shuffle among themselves (lane i reads lane i^1, lane 3 reads absent lane 20).
cudaError_t shuffle_half_warp(unsigned* out);
// One warp; even lanes vote with mask 0x55555555: out[4*lane + {0,1,2,3}] = ballot, any, all, not-all.
cudaError_t vote_even_lanes(int* out);
// One warp; 8-byte and 16-bit values through shuffles: d xor 1, ll down 1, h from lane 0, b up 2.
cudaError_t wide_shuffles(double* d, long long* ll, __half* h, __nv_bfloat16* b);
// One block of `threads`: out = {count(t%3==0), and(t<threads), or(t==threads-1), and(t!=5)}.
cudaError_t barrier_votes(int threads, int* out);
cudaError_t atomics(int blocks, int threads, AtomicResults* results);
// Reverses each block's slice of `in` through dynamic shared memory.
cudaError_t reverse_blocks(const float* in, float* out, int n, int threads);
// out[t] = dynamic shared memory word t, never written: the emulator's poison.
cudaError_t read_unwritten_smem(unsigned* out, int threads);
// 64 threads a block: block 0 writes a MINIDL_SHARED array, then every block copies it to out: the emulator's
// poison in blocks after the first.
cudaError_t read_unwritten_static_smem(unsigned* out, int blocks);
// out[y*width + x] = x << 16 | y over a 2-D grid of 2-D blocks.
cudaError_t index_2d(int* out, int width, int height, dim3 block);
// grid (2,2,2) of blocks (4,3,2): out[global linear id] = block * 1000 + thread, all from the builtins.
cudaError_t index_3d(int* out);
// Row softmax, one block of `threads` per row.
cudaError_t softmax_rows(const float* in, float* out, int rows, int cols, int threads);
// An empty kernel, for launch-configuration errors; the second raises its dynamic shared memory limit.
cudaError_t empty_launch(dim3 grid, dim3 block, size_t smem_bytes);
cudaError_t allow_dynamic_smem(int bytes);

// ---- planted bugs (the emulator must catch them; lines are marked "planted:" in kernels.cu) ----
// out[i] = in[i - 1] within a block through shared memory; the barrier between write and read is optional.
cudaError_t shift_right(const float* in, float* out, int n, int threads, bool with_barrier);
// The same through a MINIDL_SHARED array (threads <= 256).
cudaError_t shift_right_static(const float* in, float* out, int n, int threads, bool with_barrier);
// 64 threads: threads 0-31 and 32-63 call different __syncthreads.
cudaError_t divergent_barrier(float* out);
// 64 threads: threads 16-63 return, threads 0-15 wait at a barrier.
cudaError_t barrier_after_return(float* out);
// 32 threads: lanes 0-15 wait in a shuffle for lanes 16-31, which wait at a barrier.
cudaError_t shuffle_against_barrier(float* out);

}  // namespace emu_test
