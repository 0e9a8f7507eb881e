// tensor_core.h — the warp-level tensor-core primitives for kernels that build in both worlds (cuda_compat.h):
// inline PTX under nvcc (sm_80 and later), the emulator's warp collectives and deferred copies otherwise
// (cuda_emu/warp_matrix.h says how they are modelled).
//
//   mma_m16n8k16<T>(d, a, b, c)     D (16x8 f32) = A (16x16 T, row-major) * B (16x8 T, column-major) + C; T is
//                                   __half or __nv_bfloat16; all 32 lanes call it with their fragments
//   ldmatrix<N>(r, row)             N = 1, 2, 4 8x8 matrices of 16-bit elements from shared memory: lane l passes
//   ldmatrix_trans<N>(r, row)       the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); r[m] is
//                                   the lane's pair of matrix m (transposed with _trans)
//   cp_async_16(smem, gmem)         16 bytes global -> shared, asynchronously (cp.async.cg, bypassing L1)
//   cp_async_commit()               closes the calling thread's current group of copies
//   cp_async_wait<N>()              waits until at most the N newest committed groups are still in flight
//
// Fragments, per the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"), with g = lane / 4 and
// t = lane % 4; a register holds two 16-bit values, the lower index in the low half (pack_pair below):
//   a[i]: row g + 8 (i % 2), columns 2t + 8 (i / 2) + {0, 1}      ldmatrix<4> on rows 0-15 x cols 0-7, 8-15
//   b[i]: rows 2t + 8 i + {0, 1}, column g                          ldmatrix<2> on an (n, k) row-major tile, or
//                                                                   ldmatrix_trans<2> on a (k, n) row-major one
//   c[i], d[i]: row g + 8 (i / 2), column 2t + (i % 2)              so d of two adjacent n-tiles is the a of the
//                                                                   next product (FlashAttention's P)
// cp.async copies must be waited for by the thread that issued them, and a __syncthreads must separate the wait
// from other threads' reads, as for any shared-memory write.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_emu/cuda_compat.h"

// Two floats rounded to T, packed as one 32-bit register: `lo` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "pack_pair: __half or __nv_bfloat16");
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    std::memcpy(&r, &h, sizeof r);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&r, &h, sizeof r);
  }
  return r;
}

#if defined(__CUDACC__)

template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "mma_m16n8k16: __half or __nv_bfloat16");
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int N>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: 1, 2 or 4 matrices");
  if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

template <int N>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix_trans: 1, 2 or 4 matrices");
  if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(row)));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else

template <class T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                  minidl_emu_site site = minidl_emu_site::current()) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "mma_m16n8k16: __half or __nv_bfloat16");
  using minidl::emu::detail::MmaInput;
  minidl::emu::detail::mma_m16n8k16(std::is_same_v<T, __half> ? MmaInput::kF16 : MmaInput::kBF16, d, a, b, c, site);
}

template <int N>
void ldmatrix(uint32_t (&r)[N], const void* row, minidl_emu_site site = minidl_emu_site::current()) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix: 1, 2 or 4 matrices");
  minidl::emu::detail::ldmatrix(N, false, r, row, site);
}
template <int N>
void ldmatrix_trans(uint32_t (&r)[N], const void* row, minidl_emu_site site = minidl_emu_site::current()) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix_trans: 1, 2 or 4 matrices");
  minidl::emu::detail::ldmatrix(N, true, r, row, site);
}

inline void cp_async_16(void* smem, const void* gmem, minidl_emu_site site = minidl_emu_site::current()) {
  minidl::emu::detail::cp_async(smem, gmem, 16, site);
}
inline void cp_async_commit() { minidl::emu::detail::cp_async_commit(); }
template <int N>
void cp_async_wait() {
  minidl::emu::detail::cp_async_wait(N);
}

#endif
