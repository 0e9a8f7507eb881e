// Causal attention forward on tensor cores (flash_attention.h), FlashAttention-2's schedule: a block of 4 warps
// owns kQueries = 64 query rows of one (batch, head), 16 per warp, and walks the key tiles from the first to the
// diagonal. Per tile a warp computes S = Q K^T (16 x kKeys) with mma, keeps a running max and sum per row in f32
// (the online softmax, in base 2 so each exponential is one exp2f), turns P into the A operand of P V straight
// from the accumulators, and rescales its 16 x D output accumulator. Only O (rounded once to T) and the f32
// logsumexp reach global memory.
//
// K and V tiles are double-buffered: the copy of tile j + 1 (cp.async) is in flight while tile j is computed. Q's
// fragments are read from shared memory once and kept in registers. The grid is one flat dimension, (query tile,
// batch x head) with the heaviest query tiles (the last, which see the most keys) first, so B x H has no 65535
// limit and the short tiles fill the tail.
#include <cmath>

#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_attention_tile.h"

namespace minidl::ops::cuda {
namespace {

using namespace flash;

constexpr int kQueries = kWarps * kRowsPerWarp;  // 64

template <int D>
constexpr size_t forward_smem_bytes() {
  return size_t(kQueries + 4 * kScoreColumns<D>) * kPadded<D> * 2;  // Q, K[2], V[2]
}

// D = 32: without a minimum of blocks ptxas aims at a higher occupancy and caps the kernel at 128 registers on
// sm_90, spilling 16 bytes; asking for 1 block lets it take the 132 it needs. The other head sizes keep ptxas's own
// choice (0: no minimum given): a minimum of 1 would raise D = 64 from 148 to 177 registers and D = 128 from 168 to
// 209, an occupancy trade only a GPU run can judge (bench/cuda_sass_check.sh fails on any spill).
template <class T, int D>
__global__ void __launch_bounds__(kThreads, D == 32 ? 1 : 0)
    flash_forward_kernel(const T* qkv, T* out, float* lse, int BH, int H, int Hkv, int T_len, int C, float scale) {
  constexpr int kKeys = kScoreColumns<D>, kLd = kPadded<D>;
  T* q_tile = dynamic_smem<T>();
  T* k_tiles = q_tile + kQueries * kLd;  // [2][kKeys][kLd]
  T* v_tiles = k_tiles + 2 * kKeys * kLd;

  const HeadTile<D, T> tile(qkv, BH, H, Hkv, T_len, C, kQueries);
  const int q0 = tile.row0, bh = tile.bh, b = tile.b, h = tile.h;
  const int64_t ld = tile.ld;
  const T *q = tile.q, *k = tile.k, *v = tile.v;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = q0 + warp * kRowsPerWarp;  // this warp's first query row
  const int rows[2] = {warp_row0 + g, warp_row0 + g + 8};
  const float scale_log2 = scale * kLog2e;

  const int last_key = (q0 + kQueries < T_len ? q0 + kQueries : T_len) - 1;
  const int n_key_tiles = last_key / kKeys + 1;  // tiles past the diagonal are never loaded

  load_tile_async<D, kQueries>(q_tile, q, ld, q0, T_len);
  load_kv_tiles_async<D, kKeys>(k_tiles, v_tiles, k, v, ld, 0, T_len);
  cp_async_commit();

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // max of raw scores; lane's partial sum
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int j = 0; j < n_key_tiles; ++j) {
    const T* k_tile = k_tiles + (j % 2) * kKeys * kLd;
    const T* v_tile = v_tiles + (j % 2) * kKeys * kLd;
    prefetch_next_tile_and_wait(j, n_key_tiles, [&](int next) {  // tile j and Q are then in shared memory
      load_kv_tiles_async<D, kKeys>(k_tiles, v_tiles, k, v, ld, next, T_len);
    });
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) load_a<D>(qf[ks], q_tile, warp * kRowsPerWarp, ks * 16);
    }
    const int key0 = j * kKeys;
    // Warp-uniform: some key of the tile is visible to some row, and some row is a real one.
    if (key0 <= warp_row0 + kRowsPerWarp - 1 && warp_row0 < T_len) {
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
        for (int n = 0; n < kKeys / 8; n += 2) {
          uint32_t kf[4];
          load_b_nk<D>(kf, k_tile, n * 8, ks * 16);
          mma2<T>(s[n], s[n + 1], qf[ks], kf);
        }
      // Causal mask (and keys past T): element i of s[n] is row rows[i / 2], key key0 + 8n + 2t + i % 2.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = key0 + 8 * n + 2 * t + i % 2;
          if (key > rows[i / 2] || key >= T_len) s[n][i] = -INFINITY;
          tile_max[i / 2] = fmaxf(tile_max[i / 2], s[n][i]);
        }
      float factor[2], base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Tile 0 holds key 0, visible to every row, so the running max is finite from the first tile on.
        const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
        factor[r] = exp2f((row_max[r] - new_max) * scale_log2);
        row_max[r] = new_max;
        base[r] = new_max * scale_log2;
        row_sum[r] *= factor[r];
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] = exp2f(s[n][i] * scale_log2 - base[i / 2]);
          row_sum[i / 2] += s[n][i];
        }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= factor[0], o[n][1] *= factor[0];
        o[n][2] *= factor[1], o[n][3] *= factor[1];
      }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t pf[4];
        pack_a<T>(pf, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t vf[4];
          load_b_kn<D>(vf, v_tile, kk * 16, n * 8);
          mma2<T>(o[n], o[n + 1], pf, vf);
        }
      }
    }
    __syncthreads();  // tile j's buffers are refilled by the next iteration's copies
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const int i = rows[r];
    if (i >= T_len) continue;
    const float inv = 1.0f / sum;
    T* o_row = out + (int64_t(b) * T_len + i) * C + int64_t(h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t pair = pack_pair<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(o_row + 8 * n + 2 * t) = pair;
    }
    if (t == 0) lse[int64_t(bh) * T_len + i] = row_max[r] * scale + logf(sum);
  }
}

template <class T, int D>
cudaError_t launch_forward(const T* qkv, T* out, float* lse, int B, int T_len, int C, int H, int Hkv,
                           cudaStream_t stream) {
  constexpr size_t smem = forward_smem_bytes<D>();
  if (smem > 48 * 1024) {
    const cudaError_t raised =
        cudaFuncSetAttribute(flash_forward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (raised != cudaSuccess) return raised;
  }
  const int n_query_tiles = (T_len + kQueries - 1) / kQueries;
  const dim3 grid(unsigned(int64_t(n_query_tiles) * B * H));
  return launch_kernel(flash_forward_kernel<T, D>, grid, dim3(kThreads), smem, stream, qkv, out, lse, B * H, H, Hkv,
                       T_len, C, 1.0f / sqrtf(float(D)));
}

template <class T>
cudaError_t forward(const T* qkv, T* out, float* lse, int B, int T_len, int C, int H, int Hkv, cudaStream_t stream) {
  if (!aligned16(qkv, out) || Hkv < 1 || H % Hkv != 0) return cudaErrorInvalidValue;
  if (B == 0 || T_len == 0) return cudaSuccess;
  switch (C / H) {
    case 32: return launch_forward<T, 32>(qkv, out, lse, B, T_len, C, H, Hkv, stream);
    case 64: return launch_forward<T, 64>(qkv, out, lse, B, T_len, C, H, Hkv, stream);
    case 128: return launch_forward<T, 128>(qkv, out, lse, B, T_len, C, H, Hkv, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t flash_attention_forward(const __half* qkv, __half* out, float* lse, int B, int T, int C, int n_head,
                                    int n_kv_head, cudaStream_t stream) {
  return forward(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
}
cudaError_t flash_attention_forward(const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse, int B, int T, int C,
                                    int n_head, int n_kv_head, cudaStream_t stream) {
  return forward(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
}

}  // namespace minidl::ops::cuda
