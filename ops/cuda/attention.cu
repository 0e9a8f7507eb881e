// Flash-style causal attention forward on the GPU (ops/attention.h; CPU reference ops/cpu/attention.cpp): per
// (batch, head) and block of kQueries query rows, the key/value tiles up to the diagonal pass through shared
// memory, each query row keeps an online softmax (kernels::OnlineSoftmax) and its output row in registers, and
// only the output (B, T, C) and the logsumexp (B, H, T) reach global memory: nothing T x T is ever stored. With
// grouped kv heads (Hkv < H) a query head's block reads its kv head's K and V, rows (H + 2 Hkv) D apart.
//
// Scalar f32 CUDA C++: the path for f32 inputs; f16/bf16 inputs with head dimension 32, 64 or 128 take the
// tensor-core kernels of flash_attention.cu. Work split: a warp owns kQueries / kWarps query rows. For a tile of kKeys
// = 32 keys, lane j computes the score of key j (K is stored with a padded row, D + 1 floats, so the 32 lanes hit 32
// banks), the warp reduces the tile's max and sum with shuffles, and then each lane accumulates output dimensions lane,
// lane + 32, ... (V rows read at consecutive addresses: no bank conflicts). The 32 probabilities of a row reach
// every lane through shared memory (each lane stores its p_j, one __syncwarp, then all lanes read p_j at the same
// address: a broadcast) rather than 32 __shfl_sync: the same cost on a GPU, and one warp collective instead of 32
// on the emulator, where every collective switches all 32 fibers.
#include <cmath>

#include "ops/cuda/device_utils.h"
#include "ops/cuda/attention.h"
#include "ops/kernels/softmax.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kQueries = 16;  // query rows per block
constexpr int kRowsPerWarp = kQueries / kWarps;
constexpr int kKeys = kWarpSize;  // keys per tile: one per lane
// At least 4 resident blocks per SM: holds registers to 128 per thread (without it, and with the key loop fully
// unrolled, sm_90's ptxas took 155 for D = 64); unrolling that loop by 8 keeps every D under it without spills.
constexpr int kMinBlocksPerSm = 4;
constexpr int kMaxGridY = 65535;  // CUDA's limit on gridDim.y

constexpr size_t smem_floats(int D) {
  return size_t(kQueries) * D + size_t(kKeys) * (D + 1) + size_t(kKeys) * D + size_t(kQueries) * kKeys;
}

// grid (ceil(T / kQueries), B * H); dynamic shared memory smem_floats(D) floats. C = H D; Hkv kv heads.
template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    attention_forward_kernel(const float* qkv, float* out, float* lse, int T, int C, int H, int Hkv) {
  constexpr int kDimsPerLane = (D + kWarpSize - 1) / kWarpSize;
  float* q_tile = dynamic_smem<float>();     // (kQueries, D)
  float* k_tile = q_tile + kQueries * D;     // (kKeys, D + 1)
  float* v_tile = k_tile + kKeys * (D + 1);  // (kKeys, D)
  float* p_tile = v_tile + kKeys * D;        // (kQueries, kKeys): each row's probabilities for the tile
  const int b = int(blockIdx.y) / H, h = int(blockIdx.y) % H;
  const int i0 = int(blockIdx.x) * kQueries;
  const int64_t ld = int64_t(C) + 2 * int64_t(Hkv) * D;
  const float* q = qkv + int64_t(b) * T * ld + int64_t(h) * D;
  const float* k = qkv + int64_t(b) * T * ld + C + int64_t(h / (H / Hkv)) * D;
  const float* v = k + int64_t(Hkv) * D;
  const float scale = 1.0f / sqrtf(float(D));
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;

  // Rows past T are zeros: they are computed like the others but never written.
  for (int e = threadIdx.x; e < kQueries * D; e += kThreads) {
    const int r = e / D, d = e % D;
    q_tile[e] = i0 + r < T ? q[int64_t(i0 + r) * ld + d] : 0.0f;
  }

  kernels::OnlineSoftmax<float> row[kRowsPerWarp];
  float acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    row[r] = {-INFINITY, 0.0f};
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) acc[r][k2] = 0.0f;
  }

  const int last_query = i0 + kQueries - 1 < T - 1 ? i0 + kQueries - 1 : T - 1;
  for (int j0 = 0; j0 <= last_query; j0 += kKeys) {
    __syncthreads();  // the previous tile has been read (and, the first time, q_tile written)
    for (int e = threadIdx.x; e < kKeys * D; e += kThreads) {
      const int j = e / D, d = e % D;
      const bool in = j0 + j < T;  // zeros past T: p = 0 must not meet a NaN
      k_tile[j * (D + 1) + d] = in ? k[int64_t(j0 + j) * ld + d] : 0.0f;
      v_tile[e] = in ? v[int64_t(j0 + j) * ld + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r, i = i0 + qr;
      float s = 0.0f;
      for (int d = 0; d < D; ++d) s += q_tile[qr * D + d] * k_tile[lane * (D + 1) + d];
      s = j0 + lane <= i ? s * scale : -INFINITY;  // causal mask
      float tile_max = s;
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, offset));
      if (tile_max == -INFINITY) continue;  // no visible key in this tile (warp-uniform)
      const float factor = row[r].rescale_for(tile_max);
      const float p = expf(s - row[r].max);
      row[r].sum += warp_sum(p);
      float* p_row = p_tile + qr * kKeys;  // this row's slot, rewritten only after the next tile's barrier
      p_row[lane] = p;
      __syncwarp(kFullWarp);
#pragma unroll
      for (int k2 = 0; k2 < kDimsPerLane; ++k2) acc[r][k2] *= factor;
#pragma unroll 8
      for (int j = 0; j < kKeys; ++j) {
        const float pj = p_row[j];
#pragma unroll
        for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
          const int d = lane + k2 * kWarpSize;
          if (d < D) acc[r][k2] += pj * v_tile[j * D + d];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = i0 + warp * kRowsPerWarp + r;
    if (i >= T) continue;
    const float inv = 1.0f / row[r].sum;
    float* o = out + (int64_t(b) * T + i) * C + int64_t(h) * D;
#pragma unroll
    for (int k2 = 0; k2 < kDimsPerLane; ++k2) {
      const int d = lane + k2 * kWarpSize;
      if (d < D) o[d] = acc[r][k2] * inv;
    }
    if (lane == 0) lse[(int64_t(b) * H + h) * T + i] = row[r].logsumexp();
  }
}

template <int D>
cudaError_t launch_forward(const float* qkv, float* out, float* lse, int B, int T, int C, int H, int Hkv,
                           cudaStream_t stream) {
  // gridDim.y (one block row per (batch, head)) is limited to 65535 on the GPU: B * H beyond it (B = 1024, H = 64)
  // would fail to launch. Whole batches go in launches of at most 65535 / H, with the pointers moved past the
  // batches already done (the kernel indexes from its b = blockIdx.y / H).
  const int per_launch = H < kMaxGridY ? kMaxGridY / H : 1;
  for (int b0 = 0; b0 < B; b0 += per_launch) {
    const int nb = B - b0 < per_launch ? B - b0 : per_launch;
    const dim3 grid(unsigned((T + kQueries - 1) / kQueries), unsigned(nb * H));
    const cudaError_t launched =
        launch_kernel(attention_forward_kernel<D>, grid, dim3(kThreads), smem_floats(D) * sizeof(float), stream,
                      qkv + int64_t(b0) * T * (C + 2 * int64_t(Hkv) * D), out + int64_t(b0) * T * C,
                      lse + int64_t(b0) * H * T, T, C, H, Hkv);
    if (launched != cudaSuccess) return launched;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t causal_attention_forward(const float* qkv, float* out, float* lse, int B, int T, int C, int n_head,
                                     int n_kv_head, cudaStream_t stream) {
  if (n_kv_head < 1 || n_head % n_kv_head != 0) return cudaErrorInvalidValue;
  if (B == 0 || T == 0) return cudaSuccess;
  switch (C / n_head) {
    case 16: return launch_forward<16>(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
    case 32: return launch_forward<32>(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
    case 64: return launch_forward<64>(qkv, out, lse, B, T, C, n_head, n_kv_head, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace minidl::ops::cuda
