// Flash-style causal attention backward on the GPU (ops/attention.h; CPU reference ops/cpu/attention.cpp),
// FlashAttention-2's equations with P = exp(S - lse) recomputed per tile and Drow = rowsum(dO * O):
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - Drow),  dQ = scale dS K,  dK = scale dS^T Q.
// Three kernels, each output element written by exactly one thread (no atomics: the same bits on every run):
//   drow:  Drow per query row, one warp per row.
//   dk_dv: a block owns kTile keys of one kv head and walks, for each query head of the kv head's group in
//          order, the query tiles at and after them; a warp accumulates dK and dV of its keys in registers, lane i
//          handling query i of the tile for the scores (the group's sum, in one fixed order).
//   dq:    a block owns kTile queries and walks the key tiles up to the diagonal; the same tile math, transposed.
// Recomputing the scores in both dk_dv and dq costs one extra QK^T and dO V^T per tile, the price of having no
// float atomics on dQ. Tile rows are padded to D + 1 floats, so lane-indexed rows fall in 32 different banks.
// A row's 32 values of P and dS reach every lane through shared memory (store, __syncwarp, broadcast reads)
// rather than one __shfl_sync each: the same cost on a GPU, one warp collective instead of 32 (or 64) on the
// emulator, where every collective switches all 32 fibers.
#include <cmath>

#include "ops/cuda/device_utils.h"
#include "ops/cuda/attention.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTile = kWarpSize;              // queries or keys per tile: one per lane
constexpr int kRowsPerWarp = kTile / kWarps;  // keys (dk_dv) or queries (dq) a warp owns

__host__ __device__ constexpr size_t tile_floats(int D) { return size_t(kTile) * (D + 1); }

// Offsets of query head h of batch b in qkv-shaped (row stride C + 2 Hkv D) and out-shaped (row stride C = H D)
// tensors: its q, its kv head's k and v (head h / (H / Hkv)), its out and its lse/Drow row.
struct HeadView {
  int64_t q, k, v, out, stats;
};
__device__ __forceinline__ HeadView head_view(int b, int h, int T, int C, int H, int Hkv, int D) {
  const int64_t first = int64_t(b) * T * (int64_t(C) + 2 * int64_t(Hkv) * D);
  const int64_t k = first + C + int64_t(h / (H / Hkv)) * D;
  return {first + int64_t(h) * D, k, k + int64_t(Hkv) * D, int64_t(b) * T * C + int64_t(h) * D,
          (int64_t(b) * H + h) * T};
}

// Copies rows [first, first + kTile) of a (T, D) slice with row stride ld into a padded tile; zeros past T.
template <int D>
__device__ __forceinline__ void load_tile(float* tile, const float* src, int64_t ld, int first, int T) {
  for (int e = threadIdx.x; e < kTile * D; e += kThreads) {
    const int r = e / D, d = e % D;
    tile[r * (D + 1) + d] = first + r < T ? src[int64_t(first + r) * ld + d] : 0.0f;
  }
}

// Drow[b, h, i] = sum_d dO[b, i, h*D + d] * O[b, i, h*D + d]; one warp per (b, h, i), rows = B * H * T.
__global__ void __launch_bounds__(kThreads)
    attention_drow_kernel(const float* dout, const float* out, float* drow, int64_t rows, int T, int C, int H) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warps; no block barrier here
  const int lane = threadIdx.x % kWarpSize, D = C / H;
  const int64_t bh = row / T, i = row % T;
  const int64_t at = (bh / H * T + i) * C + bh % H * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += kWarpSize) s += dout[at + d] * out[at + d];
  s = warp_sum(s);
  if (lane == 0) drow[row] = s;
}

// grid (ceil(T / kTile), B * Hkv); smem: K, V, Q, dO tiles (tile_floats(D) each), lse, Drow (kTile each), P and
// dS rows (kTile * kTile each).
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_dk_dv_kernel(const float* qkv, const float* dout, const float* lse, const float* drow, float* dqkv, int T,
                           int C, int H, int Hkv) {
  constexpr int kDimsPerLane = (D + kWarpSize - 1) / kWarpSize;
  float* k_tile = dynamic_smem<float>();
  float* v_tile = k_tile + tile_floats(D);
  float* q_tile = v_tile + tile_floats(D);
  float* do_tile = q_tile + tile_floats(D);
  float* lse_tile = do_tile + tile_floats(D);
  float* drow_tile = lse_tile + kTile;
  float* p_slots = drow_tile + kTile;         // (kTile keys, kTile queries): P of the key row for this query tile
  float* ds_slots = p_slots + kTile * kTile;  // the same for dS
  const int group = H / Hkv, b = int(blockIdx.y) / Hkv, first_head = int(blockIdx.y) % Hkv * group;
  const HeadView kv = head_view(b, first_head, T, C, H, Hkv, D);
  const int64_t ld = int64_t(C) + 2 * int64_t(Hkv) * D;
  const float scale = 1.0f / sqrtf(float(D));
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int j0 = int(blockIdx.x) * kTile;
  load_tile<D>(k_tile, qkv + kv.k, ld, j0, T);
  load_tile<D>(v_tile, qkv + kv.v, ld, j0, T);

  float dk[kRowsPerWarp][kDimsPerLane], dv[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) dk[r][k2] = dv[r][k2] = 0.0f;

  for (int step = 0, n_tiles = (T - j0 + kTile - 1) / kTile; step < group * n_tiles; ++step) {
    // Query head first_head + step / n_tiles, its query tiles at and after the key tile (aligned: same kTile).
    const HeadView hv = head_view(b, first_head + step / n_tiles, T, C, H, Hkv, D);
    const int i0 = j0 + step % n_tiles * kTile;
    __syncthreads();  // the previous query tile has been read
    load_tile<D>(q_tile, qkv + hv.q, ld, i0, T);
    load_tile<D>(do_tile, dout + hv.out, C, i0, T);
    if (threadIdx.x < kTile) {
      const bool in = i0 + int(threadIdx.x) < T;
      lse_tile[threadIdx.x] = in ? lse[hv.stats + i0 + threadIdx.x] : 0.0f;
      drow_tile[threadIdx.x] = in ? drow[hv.stats + i0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();
    const int i = i0 + lane;  // this lane's query
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int key = warp * kRowsPerWarp + r, j = j0 + key;
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        s += q_tile[lane * (D + 1) + d] * k_tile[key * (D + 1) + d];
        dp += do_tile[lane * (D + 1) + d] * v_tile[key * (D + 1) + d];
      }
      const float p = j <= i && i < T && j < T ? expf(s * scale - lse_tile[lane]) : 0.0f;
      const float ds = p * (dp - drow_tile[lane]);
      float* p_row = p_slots + key * kTile;  // rewritten only after the next query tile's barrier
      float* ds_row = ds_slots + key * kTile;
      p_row[lane] = p;
      ds_row[lane] = ds;
      __syncwarp(kFullWarp);
#pragma unroll 8
      for (int q = 0; q < kTile; ++q) {
        const float pq = p_row[q], dsq = ds_row[q];
#pragma unroll
        for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
          const int d = lane + k2 * kWarpSize;
          if (d < D) {
            dv[r][k2] += pq * do_tile[q * (D + 1) + d];
            dk[r][k2] += dsq * q_tile[q * (D + 1) + d];
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int j = j0 + warp * kRowsPerWarp + r;
    if (j >= T) continue;
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
      const int d = lane + k2 * kWarpSize;
      if (d < D) {
        dqkv[kv.k + int64_t(j) * ld + d] = dk[r][k2] * scale;
        dqkv[kv.v + int64_t(j) * ld + d] = dv[r][k2];
      }
    }
  }
}

// grid (ceil(T / kTile), B * H); smem: Q, dO, K, V tiles (tile_floats(D) each) and dS rows (kTile * kTile).
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const float* qkv, const float* dout, const float* lse, const float* drow, float* dqkv, int T,
                        int C, int H, int Hkv) {
  constexpr int kDimsPerLane = (D + kWarpSize - 1) / kWarpSize;
  float* q_tile = dynamic_smem<float>();
  float* do_tile = q_tile + tile_floats(D);
  float* k_tile = do_tile + tile_floats(D);
  float* v_tile = k_tile + tile_floats(D);
  float* ds_slots = v_tile + tile_floats(D);  // (kTile queries, kTile keys): dS of the query row for this key tile
  const HeadView hv = head_view(int(blockIdx.y) / H, int(blockIdx.y) % H, T, C, H, Hkv, D);
  const int64_t ld = int64_t(C) + 2 * int64_t(Hkv) * D;
  const float scale = 1.0f / sqrtf(float(D));
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int i0 = int(blockIdx.x) * kTile;
  load_tile<D>(q_tile, qkv + hv.q, ld, i0, T);
  load_tile<D>(do_tile, dout + hv.out, C, i0, T);

  float dq[kRowsPerWarp][kDimsPerLane], row_lse[kRowsPerWarp], row_drow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = i0 + warp * kRowsPerWarp + r;
    row_lse[r] = i < T ? lse[hv.stats + i] : 0.0f;
    row_drow[r] = i < T ? drow[hv.stats + i] : 0.0f;
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) dq[r][k2] = 0.0f;
  }

  const int last_query = i0 + kTile - 1 < T - 1 ? i0 + kTile - 1 : T - 1;
  for (int j0 = 0; j0 <= last_query; j0 += kTile) {
    __syncthreads();  // the previous key tile has been read (and, the first time, the Q and dO tiles written)
    load_tile<D>(k_tile, qkv + hv.k, ld, j0, T);
    load_tile<D>(v_tile, qkv + hv.v, ld, j0, T);
    __syncthreads();
    const int j = j0 + lane;  // this lane's key
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int query = warp * kRowsPerWarp + r, i = i0 + query;
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        s += q_tile[query * (D + 1) + d] * k_tile[lane * (D + 1) + d];
        dp += do_tile[query * (D + 1) + d] * v_tile[lane * (D + 1) + d];
      }
      const float p = j <= i && i < T ? expf(s * scale - row_lse[r]) : 0.0f;
      const float ds = p * (dp - row_drow[r]);
      float* ds_row = ds_slots + query * kTile;  // rewritten only after the next key tile's barrier
      ds_row[lane] = ds;
      __syncwarp(kFullWarp);
#pragma unroll 8
      for (int k = 0; k < kTile; ++k) {
        const float dsk = ds_row[k];
#pragma unroll
        for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
          const int d = lane + k2 * kWarpSize;
          if (d < D) dq[r][k2] += dsk * k_tile[k * (D + 1) + d];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = i0 + warp * kRowsPerWarp + r;
    if (i >= T) continue;
    float* row = dqkv + hv.q + int64_t(i) * ld;
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
      const int d = lane + k2 * kWarpSize;
      if (d < D) row[d] = dq[r][k2] * scale;
    }
  }
}

template <int D>
cudaError_t launch_backward(const float* dout, const float* qkv, const float* lse, const float* drow, float* dqkv,
                            int B, int T, int C, int H, int Hkv, cudaStream_t stream) {
  // gridDim.y (one block row per (batch, head)) is limited to 65535 on the GPU: B * H beyond it would fail to
  // launch. Whole batches go in launches of at most 65535 / H, the pointers moved past the batches already done.
  constexpr int kMaxGridY = 65535;
  const int per_launch = H < kMaxGridY ? kMaxGridY / H : 1;
  const int64_t ld = int64_t(C) + 2 * int64_t(Hkv) * D;
  for (int b0 = 0; b0 < B; b0 += per_launch) {
    const int nb = B - b0 < per_launch ? B - b0 : per_launch;
    const unsigned tiles = unsigned((T + kTile - 1) / kTile);
    const float* q = qkv + int64_t(b0) * T * ld;
    const float* o = dout + int64_t(b0) * T * C;
    const float* l = lse + int64_t(b0) * H * T;
    const float* r = drow + int64_t(b0) * H * T;
    float* dq = dqkv + int64_t(b0) * T * ld;
    cudaError_t launched = launch_kernel(attention_dk_dv_kernel<D>, dim3(tiles, unsigned(nb * Hkv)), dim3(kThreads),
                                         (4 * tile_floats(D) + 2 * kTile + 2 * kTile * kTile) * sizeof(float), stream,
                                         q, o, l, r, dq, T, C, H, Hkv);
    if (launched != cudaSuccess) return launched;
    launched =
        launch_kernel(attention_dq_kernel<D>, dim3(tiles, unsigned(nb * H)), dim3(kThreads),
                      (4 * tile_floats(D) + kTile * kTile) * sizeof(float), stream, q, o, l, r, dq, T, C, H, Hkv);
    if (launched != cudaSuccess) return launched;
  }
  return cudaSuccess;
}

}  // namespace

size_t causal_attention_backward_scratch_floats(int B, int T, int n_head) { return size_t(B) * T * n_head; }

cudaError_t causal_attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                                      float* dqkv, float* scratch, int B, int T, int C, int n_head, int n_kv_head,
                                      cudaStream_t stream) {
  if (n_kv_head < 1 || n_head % n_kv_head != 0) return cudaErrorInvalidValue;
  if (B == 0 || T == 0) return cudaSuccess;
  const int D = C / n_head;
  if (D != 16 && D != 32 && D != 64) return cudaErrorInvalidValue;
  const int64_t rows = int64_t(B) * n_head * T;
  const cudaError_t launched = launch_kernel(attention_drow_kernel, dim3(unsigned((rows + kWarps - 1) / kWarps)),
                                             dim3(kThreads), 0, stream, dout, out, scratch, rows, T, C, n_head);
  if (launched != cudaSuccess) return launched;
  switch (D) {
    case 16: return launch_backward<16>(dout, qkv, lse, scratch, dqkv, B, T, C, n_head, n_kv_head, stream);
    case 32: return launch_backward<32>(dout, qkv, lse, scratch, dqkv, B, T, C, n_head, n_kv_head, stream);
    default: return launch_backward<64>(dout, qkv, lse, scratch, dqkv, B, T, C, n_head, n_kv_head, stream);
  }
}

}  // namespace minidl::ops::cuda
