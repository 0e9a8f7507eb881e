// Causal attention backward on tensor cores (flash_attention.h), FlashAttention-2's equations with
// P = exp(S - L) recomputed from the forward's logsumexp L and Drow = rowsum(dO * O):
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - Drow),   dQ = scale dS K,   dK = scale dS^T Q.
// Three kernels, each writing its own outputs once, so the result has the same bits on every run (no float
// atomics, docs/decisions.md "GPU reductions"):
//   row_dot_kernel   Drow per (batch, head, query row), f32, into the scratch
//   dq_kernel        a block per 64 query rows of one (batch, head), walking the key tiles up to the diagonal
//                    (the forward's schedule): S, P, dP, dS per tile, dQ accumulated in registers
//   dkv_kernel       a block per 64 keys of one kv head, walking, for each query head of its group in order, the
//                    query tiles from the diagonal on: the transposed products S^T = K Q^T, dP^T = V dO^T give
//                    P^T and dS^T with keys as rows, so dV and dK accumulate in registers as A operands straight
//                    from the accumulators (a grouped kv head's sum over its query heads in one fixed order)
// Recomputing S and P in both kernels costs a second pass over the scores but keeps every reduction in one block.
// Q/dO (dkv) and K/V (dq) tiles are double-buffered with cp.async like the forward's; grids are flat (no 65535
// limit), the heaviest tiles first.
#include <cmath>

#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_attention_tile.h"

namespace minidl::ops::cuda {
namespace {

using namespace flash;

constexpr int kBlockRows = kWarps * kRowsPerWarp;  // 64 query rows (dq) or keys (dkv) per block

// One warp per (batch, row, head): drow[(b * H + h) * T + i] = sum_d dout * out.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    row_dot_kernel(const T* dout, const T* out, float* drow, int64_t rows, int T_len, int H) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + int(threadIdx.x) / kWarpSize;  // (b * T + i) * H + h
  const int lane = int(threadIdx.x) % kWarpSize;
  if (row >= rows) return;  // whole warps: no barrier follows
  float s = 0.0f;
#pragma unroll
  for (int d = lane; d < D; d += kWarpSize) s += float(dout[row * D + d]) * float(out[row * D + d]);
  s = warp_sum(s);
  const int64_t bi = row / H, h = row % H, b = bi / T_len, i = bi % T_len;
  if (lane == 0) drow[(b * H + h) * T_len + i] = s;
}

template <int D>
constexpr size_t dq_smem_bytes() {
  return size_t(2 * kBlockRows + 4 * kScoreColumns<D>) * kPadded<D> * 2;  // Q, dO, K[2], V[2]
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(const T* dout, const T* qkv, const float* lse, const float* drow,
                                                      T* dqkv, int BH, int H, int Hkv, int T_len, int C, float scale) {
  constexpr int kKeys = kScoreColumns<D>, kLd = kPadded<D>;
  T* q_tile = dynamic_smem<T>();
  T* do_tile = q_tile + kBlockRows * kLd;
  T* k_tiles = do_tile + kBlockRows * kLd;  // [2][kKeys][kLd]
  T* v_tiles = k_tiles + 2 * kKeys * kLd;

  const HeadTile<D, T> tile(qkv, BH, H, Hkv, T_len, C, kBlockRows);
  const int q0 = tile.row0, bh = tile.bh, b = tile.b, h = tile.h;
  const int64_t ld = tile.ld;
  const T *q = tile.q, *k = tile.k, *v = tile.v;
  const T* dO = dout + int64_t(b) * T_len * C + int64_t(h) * D;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = q0 + warp * kRowsPerWarp;
  const int rows[2] = {warp_row0 + g, warp_row0 + g + 8};
  const float scale_log2 = scale * kLog2e;
  float row_lse[2], row_drow[2];  // log2 units; rows past T get P = 0
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in = rows[r] < T_len;
    row_lse[r] = in ? lse[int64_t(bh) * T_len + rows[r]] * kLog2e : INFINITY;
    row_drow[r] = in ? drow[int64_t(bh) * T_len + rows[r]] : 0.0f;
  }

  const int last_key = (q0 + kBlockRows < T_len ? q0 + kBlockRows : T_len) - 1;
  const int n_key_tiles = last_key / kKeys + 1;

  load_tile_async<D, kBlockRows>(q_tile, q, ld, q0, T_len);
  load_tile_async<D, kBlockRows>(do_tile, dO, C, q0, T_len);
  load_kv_tiles_async<D, kKeys>(k_tiles, v_tiles, k, v, ld, 0, T_len);
  cp_async_commit();

  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  for (int j = 0; j < n_key_tiles; ++j) {
    const T* k_tile = k_tiles + (j % 2) * kKeys * kLd;
    const T* v_tile = v_tiles + (j % 2) * kKeys * kLd;
    prefetch_next_tile_and_wait(
        j, n_key_tiles, [&](int next) { load_kv_tiles_async<D, kKeys>(k_tiles, v_tiles, k, v, ld, next, T_len); });
    const int key0 = j * kKeys;
    if (key0 <= warp_row0 + kRowsPerWarp - 1 && warp_row0 < T_len) {  // warp-uniform, as in the forward
      float s[kKeys / 8][4], dp[kKeys / 8][4];
      two_products<D, kKeys>(s, dp, q_tile, do_tile, warp * kRowsPerWarp, k_tile, v_tile);  // S = Q Kᵀ, dP = dO Vᵀ
      // dS = P * (dP - Drow), in place of dp; element i of a tile is row rows[i / 2], key key0 + 8n + 2t + i % 2.
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = key0 + 8 * n + 2 * t + i % 2;
          const float p = key <= rows[i / 2] ? exp2f(s[n][i] * scale_log2 - row_lse[i / 2]) : 0.0f;
          dp[n][i] = p * (dp[n][i] - row_drow[i / 2]);
        }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t sf[4];
        pack_a<T>(sf, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t kf[4];
          load_b_kn<D>(kf, k_tile, kk * 16, n * 8);
          mma2<T>(dq[n], dq[n + 1], sf, kf);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= T_len) continue;
    T* dq_row = dqkv + (int64_t(b) * T_len + rows[r]) * ld + int64_t(h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(dq_row + 8 * n + 2 * t) =
          pack_pair<T>(dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale);
  }
}

template <int D>
constexpr size_t dkv_smem_bytes() {
  return size_t(2 * kBlockRows + 4 * kScoreColumns<D>) * kPadded<D> * 2 +  // K, V, Q[2], dO[2]
         size_t(4 * kScoreColumns<D>) * sizeof(float);                     // lse[2], drow[2]
}

// One block per (key tile, batch x kv head), BHkv = B Hkv of them per key tile.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    dkv_kernel(const T* dout, const T* qkv, const float* lse, const float* drow, T* dqkv, int BHkv, int H, int Hkv,
               int T_len, int C, float scale) {
  constexpr int kQueries = kScoreColumns<D>, kLd = kPadded<D>;
  T* k_tile = dynamic_smem<T>();
  T* v_tile = k_tile + kBlockRows * kLd;
  T* q_tiles = v_tile + kBlockRows * kLd;  // [2][kQueries][kLd]
  T* do_tiles = q_tiles + 2 * kQueries * kLd;
  float* lse_tiles = reinterpret_cast<float*>(do_tiles + 2 * kQueries * kLd);  // [2][kQueries], log2 units
  float* drow_tiles = lse_tiles + 2 * kQueries;

  const int bkv = int(blockIdx.x % unsigned(BHkv));
  const int k0 = int(blockIdx.x / unsigned(BHkv)) * kBlockRows;  // the first key tiles see the most queries
  const int b = bkv / Hkv, kv = bkv % Hkv, group = H / Hkv;
  const int64_t ld = int64_t(C) + 2 * int64_t(Hkv) * D;
  const T* k = qkv + int64_t(b) * T_len * ld + C + int64_t(kv) * D;
  const T* v = k + int64_t(Hkv) * D;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_key0 = k0 + warp * kRowsPerWarp;
  const int keys[2] = {warp_key0 + g, warp_key0 + g + 8};
  const float scale_log2 = scale * kLog2e;

  const int first_tile = k0 / kQueries;                                // queries before k0 see none of these keys
  const int n_tiles = (T_len + kQueries - 1) / kQueries - first_tile;  // per query head
  // Step `it` is query tile first_tile + it % n_tiles of the group's query head it / n_tiles. Its tile goes into
  // buffer it % 2: Q and dO by cp.async, the row statistics by plain stores (visible after the barrier that
  // follows the tile's wait).
  const auto load_queries = [&](int it) {
    const int buf = it % 2, row0 = (first_tile + it % n_tiles) * kQueries, h = kv * group + it / n_tiles;
    const T* q = qkv + int64_t(b) * T_len * ld + int64_t(h) * D;
    const T* dO = dout + int64_t(b) * T_len * C + int64_t(h) * D;
    const float* head_lse = lse + (int64_t(b) * H + h) * T_len;
    const float* head_drow = drow + (int64_t(b) * H + h) * T_len;
    load_tile_async<D, kQueries>(q_tiles + buf * kQueries * kLd, q, ld, row0, T_len);
    load_tile_async<D, kQueries>(do_tiles + buf * kQueries * kLd, dO, C, row0, T_len);
    for (int r = int(threadIdx.x); r < kQueries; r += kThreads) {
      const bool in = row0 + r < T_len;
      lse_tiles[buf * kQueries + r] = in ? head_lse[row0 + r] * kLog2e : INFINITY;
      drow_tiles[buf * kQueries + r] = in ? head_drow[row0 + r] : 0.0f;
    }
  };

  load_tile_async<D, kBlockRows>(k_tile, k, ld, k0, T_len);
  load_tile_async<D, kBlockRows>(v_tile, v, ld, k0, T_len);
  load_queries(0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.0f;

  for (int it = 0; it < group * n_tiles; ++it) {
    const int buf = it % 2, q0 = (first_tile + it % n_tiles) * kQueries;
    const T* q_tile = q_tiles + buf * kQueries * kLd;
    const T* do_tile = do_tiles + buf * kQueries * kLd;
    const float* tile_lse = lse_tiles + buf * kQueries;
    const float* tile_drow = drow_tiles + buf * kQueries;
    prefetch_next_tile_and_wait(it, group * n_tiles, load_queries);
    // Warp-uniform: some query of the tile sees some key of the warp, and some key is a real one.
    if (q0 + kQueries - 1 >= warp_key0 && warp_key0 < T_len) {
      float s[kQueries / 8][4], dp[kQueries / 8][4];
      two_products<D, kQueries>(s, dp, k_tile, v_tile, warp * kRowsPerWarp, q_tile, do_tile);  // Sᵀ, dPᵀ
      // P^T in s and dS^T in dp; element i of a tile is key keys[i / 2], query q0 + 8n + 2t + i % 2.
#pragma unroll
      for (int n = 0; n < kQueries / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 8 * n + 2 * t + i % 2;
          const float p = keys[i / 2] <= q0 + c ? exp2f(s[n][i] * scale_log2 - tile_lse[c]) : 0.0f;
          s[n][i] = p;
          dp[n][i] = p * (dp[n][i] - tile_drow[c]);
        }
#pragma unroll
      for (int kk = 0; kk < kQueries / 16; ++kk) {
        uint32_t pf[4], sf[4];
        pack_a<T>(pf, s[2 * kk], s[2 * kk + 1]);
        pack_a<T>(sf, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t df[4], qf[4];
          load_b_kn<D>(df, do_tile, kk * 16, n * 8);
          mma2<T>(dv[n], dv[n + 1], pf, df);
          load_b_kn<D>(qf, q_tile, kk * 16, n * 8);
          mma2<T>(dk[n], dk[n + 1], sf, qf);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= T_len) continue;
    T* dk_row = dqkv + (int64_t(b) * T_len + keys[r]) * ld + C + int64_t(kv) * D;
    T* dv_row = dk_row + int64_t(Hkv) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * n + 2 * t) =
          pack_pair<T>(dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * n + 2 * t) = pack_pair<T>(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

template <class Kernel>
cudaError_t allow_smem(Kernel* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <class T, int D>
cudaError_t launch_backward(const T* dout, const T* qkv, const T* out, const float* lse, T* dqkv, float* drow, int B,
                            int T_len, int C, int H, int Hkv, cudaStream_t stream) {
  const float scale = 1.0f / sqrtf(float(D));
  const int64_t rows = int64_t(B) * T_len * H;
  cudaError_t e = launch_kernel(row_dot_kernel<T, D>, dim3(unsigned((rows + kWarps - 1) / kWarps)), dim3(kThreads), 0,
                                stream, dout, out, drow, rows, T_len, H);
  if (e != cudaSuccess) return e;
  const unsigned tiles = unsigned((T_len + kBlockRows - 1) / kBlockRows);
  if ((e = allow_smem(dq_kernel<T, D>, dq_smem_bytes<D>())) != cudaSuccess) return e;
  e = launch_kernel(dq_kernel<T, D>, dim3(tiles * unsigned(B * H)), dim3(kThreads), dq_smem_bytes<D>(), stream, dout,
                    qkv, lse, drow, dqkv, B * H, H, Hkv, T_len, C, scale);
  if (e != cudaSuccess) return e;
  if ((e = allow_smem(dkv_kernel<T, D>, dkv_smem_bytes<D>())) != cudaSuccess) return e;
  return launch_kernel(dkv_kernel<T, D>, dim3(tiles * unsigned(B * Hkv)), dim3(kThreads), dkv_smem_bytes<D>(), stream,
                       dout, qkv, lse, drow, dqkv, B * Hkv, H, Hkv, T_len, C, scale);
}

template <class T>
cudaError_t backward(const T* dout, const T* qkv, const T* out, const float* lse, T* dqkv, float* scratch, int B,
                     int T_len, int C, int H, int Hkv, cudaStream_t stream) {
  if (!aligned16(dout, qkv, out, dqkv) || Hkv < 1 || H % Hkv != 0) return cudaErrorInvalidValue;
  if (!flash_attention_supports(C / H)) return cudaErrorInvalidValue;
  if (B == 0 || T_len == 0) return cudaSuccess;
  switch (C / H) {
    case 32: return launch_backward<T, 32>(dout, qkv, out, lse, dqkv, scratch, B, T_len, C, H, Hkv, stream);
    case 64: return launch_backward<T, 64>(dout, qkv, out, lse, dqkv, scratch, B, T_len, C, H, Hkv, stream);
    default: return launch_backward<T, 128>(dout, qkv, out, lse, dqkv, scratch, B, T_len, C, H, Hkv, stream);
  }
}

}  // namespace

size_t flash_attention_backward_scratch_floats(int B, int T, int n_head) { return size_t(B) * n_head * T; }

cudaError_t flash_attention_backward(const __half* dout, const __half* qkv, const __half* out, const float* lse,
                                     __half* dqkv, float* scratch, int B, int T, int C, int n_head, int n_kv_head,
                                     cudaStream_t stream) {
  return backward(dout, qkv, out, lse, dqkv, scratch, B, T, C, n_head, n_kv_head, stream);
}
cudaError_t flash_attention_backward(const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                     const float* lse, __nv_bfloat16* dqkv, float* scratch, int B, int T, int C,
                                     int n_head, int n_kv_head, cudaStream_t stream) {
  return backward(dout, qkv, out, lse, dqkv, scratch, B, T, C, n_head, n_kv_head, stream);
}

}  // namespace minidl::ops::cuda
