// Shared-memory tiles and mma fragments common to the tensor-core attention kernels (flash_attention.cu,
// flash_attention_backward.cu). Builds with nvcc and against the emulator, like the kernels.
//
// A tile is `rows` rows of D 16-bit values, padded to D + 8 per row: consecutive rows then start 16 bytes apart
// modulo 128, so the eight row addresses of one ldmatrix fall in eight different 16-byte bank groups (no bank
// conflicts) while every row stays 16-byte aligned for cp.async.
//
// Fragment helpers, for the warp's mma_m16n8k16 (cuda_emu/tensor_core.h), at row r0 and column c0 of a tile:
//   load_a        A (16 x 16) from a (row, k) tile: Q, dO, K or V rows as the left operand
//   load_b_nk     B for two n-tiles (n 16 x k 16) from an (n, k) tile: K or V rows as the right operand of Q K^T
//   load_b_kn     B for two n-tiles from a (k, n) tile (ldmatrix .trans): V rows as the right operand of P V
// and pack_a, which turns the f32 accumulators of two adjacent n-tiles (16 x 16) into an A operand: the C/D layout
// of mma matches the A layout pairwise, so P never goes through shared memory.
#pragma once

#include <cstdint>

#include "cuda_emu/tensor_core.h"
#include "ops/cuda/device_utils.h"

namespace minidl::ops::cuda::flash {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = 16;  // one mma's M
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr int kPadded = D + 8;

// Columns of a warp's 16-row score tile (keys in the forward and dQ kernels, queries in the dK/dV kernel): D = 128
// takes 32 so the score, gradient and output accumulators fit in registers without spills.
template <int D>
constexpr int kScoreColumns = D == 128 ? 32 : 64;

// Starts copying rows [row0, row0 + kRows) of a matrix whose row r is at src + r * ld into `tile`; rows at or past
// T are zero-filled at once. The caller commits the group and waits for it.
template <int D, int kRows, class T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, int64_t ld, int row0, int T_len) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = int(threadIdx.x); c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    T* dst = tile + r * kPadded<D> + 8 * k;
    if (row0 + r < T_len)
      cp_async_16(dst, src + int64_t(row0 + r) * ld + 8 * k);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// The K and V tiles of key tile j (keys [j * kKeys, (j + 1) * kKeys)) into buffer j % 2 of k_tiles and v_tiles,
// each [2][kKeys][kPadded<D>]: the forward's and the dQ kernel's double-buffered operands.
template <int D, int kKeys, class T>
__device__ __forceinline__ void load_kv_tiles_async(T* k_tiles, T* v_tiles, const T* k, const T* v, int64_t ld, int j,
                                                    int T_len) {
  const int buffer = (j % 2) * kKeys * kPadded<D>;
  load_tile_async<D, kKeys>(k_tiles + buffer, k, ld, j * kKeys, T_len);
  load_tile_async<D, kKeys>(v_tiles + buffer, v, ld, j * kKeys, T_len);
}

// The double-buffering step at the top of iteration j of a loop over n_tiles tiles, whose tile 0 was loaded and
// committed before the loop: queues tile j + 1's copies (load(j + 1), into the other buffer) as a new group, then
// waits until every group but that one has landed and every thread's copies are visible. The last iteration
// queues nothing and waits for all.
template <class Load>
__device__ __forceinline__ void prefetch_next_tile_and_wait(int j, int n_tiles, Load&& load) {
  if (j + 1 < n_tiles) {
    load(j + 1);
    cp_async_commit();
    cp_async_wait<1>();  // tile j (and what was committed with tile 0) landed; tile j + 1 stays in flight
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

template <int D, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int r0, int c0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  ldmatrix<4>(a, tile + (r0 + lane % 16) * kPadded<D> + c0 + 8 * (lane / 16));
}

// b[0], b[1]: n-tile n0 .. n0 + 7; b[2], b[3]: n0 + 8 .. n0 + 15; k from k0.
template <int D, class T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int n0, int k0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  ldmatrix<4>(b, tile + (n0 + lane % 8 + 8 * (lane / 16)) * kPadded<D> + k0 + 8 * (lane / 8 % 2));
}

template <int D, class T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int k0, int n0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  ldmatrix_trans<4>(b, tile + (k0 + lane % 16) * kPadded<D> + n0 + 8 * (lane / 16));
}

// acc[2kk], acc[2kk + 1] (columns 16 kk .. 16 kk + 15 of a 16-row accumulator) as the A operand of k-step kk.
template <class T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_pair<T>(lo[0], lo[1]);
  a[1] = pack_pair<T>(lo[2], lo[3]);
  a[2] = pack_pair<T>(hi[0], hi[1]);
  a[3] = pack_pair<T>(hi[2], hi[3]);
}

template <class T>
__device__ __forceinline__ void mma2(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<T>(d0, a, b0, d0);
  mma_m16n8k16<T>(d1, a, b1, d1);
}

// Max over the four lanes of a quad (the lanes holding one accumulator row).
// The (batch, head) and the tile of `rows` query rows a block works on — blocks are numbered heaviest tile first (the
// causal tile with the most keys), every batch x head of one tile together — and that query head's q columns and
// its kv head's (h / (H / Hkv)) k and v columns of the (B, T, C + 2 Hkv D) input (ops/attention.h), C = H D.
template <int D, class T>
struct HeadTile {
  int row0, bh, b, h;
  int64_t ld;  // elements between consecutive positions of q, k and v: C + 2 Hkv D
  const T *q, *k, *v;
  __device__ HeadTile(const T* qkv, int BH, int H, int Hkv, int T_len, int C, int rows) {
    const int n_tiles = (T_len + rows - 1) / rows;
    bh = int(blockIdx.x % unsigned(BH));
    row0 = (n_tiles - 1 - int(blockIdx.x / unsigned(BH))) * rows;
    b = bh / H;
    h = bh % H;
    ld = int64_t(C) + 2 * int64_t(Hkv) * D;
    q = qkv + int64_t(b) * T_len * ld + int64_t(h) * D;
    k = qkv + int64_t(b) * T_len * ld + C + int64_t(h / (H / Hkv)) * D;
    v = k + int64_t(Hkv) * D;
  }
};

// Two products the backward needs side by side, for this warp's 16 rows of two (row, k) tiles and N rows of two
// (n, k) tiles, over the head dimension: s = a · bᵀ and dp = c · dᵀ (dQ pass: S = Q Kᵀ, dP = dO Vᵀ; dK/dV pass:
// Sᵀ = K Qᵀ, dPᵀ = V dOᵀ). Accumulators start at zero.
template <int D, int N, class T>
__device__ __forceinline__ void two_products(float (&s)[N / 8][4], float (&dp)[N / 8][4], const T* a, const T* c,
                                             int row0, const T* b, const T* d) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = dp[n][i] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t af[4], cf[4];
    load_a<D>(af, a, row0, ks * 16);
    load_a<D>(cf, c, row0, ks * 16);
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      uint32_t bf[4], df[4];
      load_b_nk<D>(bf, b, n * 8, ks * 16);
      mma2<T>(s[n], s[n + 1], af, bf);
      load_b_nk<D>(df, d, n * 8, ks * 16);
      mma2<T>(dp[n], dp[n + 1], cf, df);
    }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullWarp, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullWarp, v, 1);
  return v + __shfl_xor_sync(kFullWarp, v, 2);
}

}  // namespace minidl::ops::cuda::flash
