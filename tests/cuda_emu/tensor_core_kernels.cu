// Test kernels for the tensor-core primitives of cuda_emu/tensor_core.h (see tensor_core_kernels.h).
#include "tensor_core_kernels.h"

#include "cuda_emu/tensor_core.h"

namespace emu_test {
namespace {

// Two consecutive 16-bit values of `m` (row-major, `ld` elements a row) as one register, the first low.
template <class T>
__device__ uint32_t pair_at(const T* m, int ld, int row, int col) {
  uint16_t lo, hi;
  memcpy(&lo, &m[row * ld + col], 2);
  memcpy(&hi, &m[row * ld + col + 1], 2);
  return uint32_t{lo} | uint32_t{hi} << 16;
}
template <class T>
__device__ uint32_t column_pair_at(const T* m, int ld, int row, int col) {  // m[row][col], m[row + 1][col]
  uint16_t lo, hi;
  memcpy(&lo, &m[row * ld + col], 2);
  memcpy(&hi, &m[(row + 1) * ld + col], 2);
  return uint32_t{lo} | uint32_t{hi} << 16;
}

template <class T>
__global__ void mma_tile_kernel(const T* a, const T* b, const float* c, float* d) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t fa[4], fb[2];
  float fc[4], fd[4];
  for (int i = 0; i < 4; ++i) fa[i] = pair_at(a, 16, g + 8 * (i % 2), 2 * t + 8 * (i / 2));
  for (int i = 0; i < 2; ++i) fb[i] = column_pair_at(b, 8, 2 * t + 8 * i, g);
  for (int i = 0; i < 4; ++i) fc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  mma_m16n8k16<T>(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = fd[i];
}

template <int N, bool kTrans>
__global__ void ldmatrix_kernel(const uint16_t* in, uint32_t* out) {
  MINIDL_SHARED(uint4, words, [32]);  // 256 16-bit values, 16-byte aligned as ldmatrix needs
  uint16_t* tile = reinterpret_cast<uint16_t*>(words);
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) tile[i] = in[i];
  __syncthreads();
  uint32_t r[N];
  const uint16_t* row = tile + (lane / 8 % N) * 64 + (lane % 8) * 8;  // lanes past 8N repeat valid addresses
  if constexpr (kTrans)
    ldmatrix_trans<N>(r, row);
  else
    ldmatrix<N>(r, row);
  for (int m = 0; m < N; ++m) out[lane * 4 + m] = r[m];
}

template <int kWait>
__global__ void async_copy_kernel(const float* in, float* out) {
  float* buf = dynamic_smem<float>();
  const int i = threadIdx.x;
  if (i % 2 == 0) cp_async_16(buf + 4 * i, in + 4 * i);
  cp_async_commit();
  if (i % 2 == 1) cp_async_16(buf + 4 * i, in + 4 * i);
  cp_async_commit();
  if constexpr (kWait >= 0) cp_async_wait<kWait>();
  __syncthreads();
  for (int k = 0; k < 4; ++k) out[4 * i + k] = buf[4 * i + k];
}

__global__ void smem_mma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, int b_layout) {
  __nv_bfloat16* sa = dynamic_smem<__nv_bfloat16>();  // 16 x 16
  __nv_bfloat16* sb = sa + 256;                       // 128 values, as given
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int c = lane; c < 32; c += 32) cp_async_16(sa + 8 * c, a + 8 * c);  // 32 chunks of 8 values
  if (lane < 16) cp_async_16(sb + 8 * lane, b + 8 * lane);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t fa[4], fb[2];
  // a: matrix m = lane / 8 is rows 8 (m % 2) .. +7, columns 8 (m / 2) .. +7.
  ldmatrix<4>(fa, sa + (8 * (lane / 8 % 2) + lane % 8) * 16 + 8 * (lane / 16));
  if (b_layout == 0)
    ldmatrix<2>(fb, sb + (lane % 8) * 16 + 8 * (lane / 8 % 2));  // (n, k): k 0-7, then 8-15
  else
    ldmatrix_trans<2>(fb, sb + (lane % 16) * 8);  // (k, n): k rows 0-7, 8-15
  float acc[4] = {0, 0, 0, 0};
  mma_m16n8k16<__nv_bfloat16>(acc, fa, fb, acc);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

}  // namespace

cudaError_t mma_tile_f16(const __half* a, const __half* b, const float* c, float* d) {
  return launch_kernel(mma_tile_kernel<__half>, 1, 32, 0, nullptr, a, b, c, d);
}
cudaError_t mma_tile_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
  return launch_kernel(mma_tile_kernel<__nv_bfloat16>, 1, 32, 0, nullptr, a, b, c, d);
}

cudaError_t ldmatrix_lanes(const uint16_t* in, uint32_t* out, int matrices, bool trans) {
  switch (matrices * 2 + trans) {
    case 2: return launch_kernel(ldmatrix_kernel<1, false>, 1, 32, 0, nullptr, in, out);
    case 3: return launch_kernel(ldmatrix_kernel<1, true>, 1, 32, 0, nullptr, in, out);
    case 4: return launch_kernel(ldmatrix_kernel<2, false>, 1, 32, 0, nullptr, in, out);
    case 5: return launch_kernel(ldmatrix_kernel<2, true>, 1, 32, 0, nullptr, in, out);
    case 8: return launch_kernel(ldmatrix_kernel<4, false>, 1, 32, 0, nullptr, in, out);
    case 9: return launch_kernel(ldmatrix_kernel<4, true>, 1, 32, 0, nullptr, in, out);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t async_copy_groups(const float* in, float* out, int wait_groups) {
  const size_t smem = 64 * 16;
  switch (wait_groups) {
    case -1: return launch_kernel(async_copy_kernel<-1>, 1, 64, smem, nullptr, in, out);
    case 0: return launch_kernel(async_copy_kernel<0>, 1, 64, smem, nullptr, in, out);
    case 1: return launch_kernel(async_copy_kernel<1>, 1, 64, smem, nullptr, in, out);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t smem_mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, int b_layout) {
  return launch_kernel(smem_mma_kernel, 1, 32, (256 + 128) * 2, nullptr, a, b, d, b_layout);
}

}  // namespace emu_test
