// device.h — the emulated thread builtins, block barriers and warp collectives (included by emulator.h).
//
// Every barrier and collective takes a trailing std::source_location defaulted to the caller's position, so
// kernels call them exactly as in CUDA while reports name the line: `__syncthreads();`,
// `v += __shfl_down_sync(0xffffffffu, v, 16);`. They may only be called from a kernel running under
// minidl::emu::launch (anywhere else they abort).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <source_location>

// Set by the scheduler before each switch into a fiber; `inline` so no TLS wrapper call guards each access.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace minidl::emu::detail {

enum class BarrierOp : uint8_t { kSync, kCount, kAnd, kOr };
enum class WarpOp : uint8_t { kSync, kBallot, kAny, kAll, kShflIdx, kShflUp, kShflDown, kShflXor, kExchange };

// Blocks the calling fiber until every thread of the block arrived; returns the predicate reduction for
// kCount/kAnd/kOr.
int block_barrier(BarrierOp op, int predicate, const std::source_location& site);

// Blocks until every lane of `mask` called the same collective; `value` holds the lane's bits (or predicate),
// `param` the source lane / delta / xor mask. Returns this lane's result bits.
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width,
                         const std::source_location& site);

// A warp-wide instruction on data larger than a shuffle's (tensor-core mma, ldmatrix; warp_matrix.h): every lane
// of `mask` deposits a pointer to its own operands and waits; the last to arrive calls compute(lanes, mask) once,
// with lanes[i] the pointer of lane i (nullptr for lanes outside the mask), and compute writes each lane's
// results through those pointers before any lane resumes. Lanes must agree on `exchange` (strict mode).
struct WarpExchange {
  const char* name;  // for reports: "mma.m16n8k16.bf16"
  void (*compute)(void* const* lanes, unsigned mask);
};
void warp_exchange(const WarpExchange& exchange, unsigned mask, void* lane_data, const std::source_location& site);

unsigned live_lanes_of_current_warp();

// Raw bytes, so __half2, __nv_bfloat16 and double travel as well as int (at most 8 bytes, as in CUDA).
template <class T>
uint64_t to_bits(const T& v) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "warp shuffles move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const void*>(&v), sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(static_cast<void*>(&v), &bits, sizeof(T));
  return v;
}

}  // namespace minidl::emu::detail

using minidl_emu_site = std::source_location;  // keeps the signatures below on one line each

inline void __syncthreads(minidl_emu_site site = minidl_emu_site::current()) {
  minidl::emu::detail::block_barrier(minidl::emu::detail::BarrierOp::kSync, 0, site);
}
inline int __syncthreads_count(int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  return minidl::emu::detail::block_barrier(minidl::emu::detail::BarrierOp::kCount, predicate, site);
}
inline int __syncthreads_and(int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  return minidl::emu::detail::block_barrier(minidl::emu::detail::BarrierOp::kAnd, predicate, site);
}
inline int __syncthreads_or(int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  return minidl::emu::detail::block_barrier(minidl::emu::detail::BarrierOp::kOr, predicate, site);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, minidl_emu_site site = minidl_emu_site::current()) {
  minidl::emu::detail::warp_collective(minidl::emu::detail::WarpOp::kSync, mask, 0, 0, warpSize, site);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return static_cast<unsigned>(warp_collective(WarpOp::kBallot, mask, predicate != 0, 0, warpSize, site));
}
inline int __any_sync(unsigned mask, int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return static_cast<int>(warp_collective(WarpOp::kAny, mask, predicate != 0, 0, warpSize, site));
}
inline int __all_sync(unsigned mask, int predicate, minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return static_cast<int>(warp_collective(WarpOp::kAll, mask, predicate != 0, 0, warpSize, site));
}
// Every lane of the warp that exists and has not returned: the emulator does not track convergence.
inline unsigned __activemask() { return minidl::emu::detail::live_lanes_of_current_warp(); }

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflIdx, mask, to_bits(var), src_lane, width, site));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflUp, mask, to_bits(var), static_cast<int>(delta), width, site));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflDown, mask, to_bits(var), static_cast<int>(delta), width, site));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  minidl_emu_site site = minidl_emu_site::current()) {
  using namespace minidl::emu::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflXor, mask, to_bits(var), lane_mask, width, site));
}
