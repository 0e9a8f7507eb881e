// atomics.h — CUDA atomics for the emulator (included by emulator.h).
//
// Blocks run in parallel on several OS threads, so these are real atomics (std::atomic_ref), not plain
// read-modify-writes. They are acq_rel rather than CUDA's relaxed: the emulator has no cheaper relaxation to
// offer, and the stronger order keeps "write, __threadfence(), atomicAdd(counter)" patterns correct under the
// C++ memory model. Floating-point and 16-bit float adds are compare-and-swap loops.
// Only the overloads CUDA declares exist, so code that would not compile under nvcc does not compile here.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace minidl::emu::detail {

// *address = update(*address) atomically; returns the old value.
template <class T, class F>
T atomic_update(T* address, F update) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, update(old), std::memory_order_acq_rel, std::memory_order_relaxed)) {}
  return old;
}

// 16-bit floats: CAS on the raw bits (atomic_ref needs a trivially copyable type of a lock-free size).
template <class H, class F>
H atomic_update_16(H* address, F update) {
  static_assert(sizeof(H) == sizeof(uint16_t));
  std::atomic_ref<uint16_t> ref(*reinterpret_cast<uint16_t*>(address));
  uint16_t old = ref.load(std::memory_order_relaxed);
  H old_h;
  uint16_t new_bits;
  do {
    std::memcpy(static_cast<void*>(&old_h), &old, sizeof(old));
    const H new_h = update(old_h);
    std::memcpy(&new_bits, static_cast<const void*>(&new_h), sizeof(new_bits));
  } while (!ref.compare_exchange_weak(old, new_bits, std::memory_order_acq_rel, std::memory_order_relaxed));
  return old_h;
}

template <class T>
T atomic_add(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val, std::memory_order_acq_rel);
}

}  // namespace minidl::emu::detail

#define MINIDL_EMU_ATOMIC_ADD(T)                                                                  \
  inline T atomicAdd(T* address, T val) { return minidl::emu::detail::atomic_add(address, val); } \
  inline T atomicSub(T* address, T val) { return minidl::emu::detail::atomic_add(address, static_cast<T>(0) - val); }
MINIDL_EMU_ATOMIC_ADD(int)
MINIDL_EMU_ATOMIC_ADD(unsigned)
MINIDL_EMU_ATOMIC_ADD(unsigned long long)
#undef MINIDL_EMU_ATOMIC_ADD

inline float atomicAdd(float* address, float val) {
  return minidl::emu::detail::atomic_update(address, [val](float old) { return old + val; });
}
inline double atomicAdd(double* address, double val) {
  return minidl::emu::detail::atomic_update(address, [val](double old) { return old + val; });
}
inline __half atomicAdd(__half* address, __half val) {
  return minidl::emu::detail::atomic_update_16(address, [val](__half old) { return __hadd(old, val); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 val) {
  return minidl::emu::detail::atomic_update_16(address, [val](__nv_bfloat16 old) { return __hadd(old, val); });
}

#define MINIDL_EMU_ATOMIC_INTEGER(T)                                                                    \
  inline T atomicMax(T* address, T val) {                                                               \
    return minidl::emu::detail::atomic_update(address, [val](T old) { return old < val ? val : old; }); \
  }                                                                                                     \
  inline T atomicMin(T* address, T val) {                                                               \
    return minidl::emu::detail::atomic_update(address, [val](T old) { return val < old ? val : old; }); \
  }                                                                                                     \
  inline T atomicExch(T* address, T val) { return std::atomic_ref<T>(*address).exchange(val); }         \
  inline T atomicCAS(T* address, T compare, T val) {                                                    \
    std::atomic_ref<T>(*address).compare_exchange_strong(compare, val, std::memory_order_acq_rel);      \
    return compare;                                                                                     \
  }                                                                                                     \
  inline T atomicAnd(T* address, T val) { return std::atomic_ref<T>(*address).fetch_and(val); }         \
  inline T atomicOr(T* address, T val) { return std::atomic_ref<T>(*address).fetch_or(val); }           \
  inline T atomicXor(T* address, T val) { return std::atomic_ref<T>(*address).fetch_xor(val); }
MINIDL_EMU_ATOMIC_INTEGER(int)
MINIDL_EMU_ATOMIC_INTEGER(unsigned)
MINIDL_EMU_ATOMIC_INTEGER(unsigned long long)
#undef MINIDL_EMU_ATOMIC_INTEGER

inline long long atomicMax(long long* address, long long val) {
  return minidl::emu::detail::atomic_update(address, [val](long long old) { return old < val ? val : old; });
}
inline long long atomicMin(long long* address, long long val) {
  return minidl::emu::detail::atomic_update(address, [val](long long old) { return val < old ? val : old; });
}
inline float atomicExch(float* address, float val) { return std::atomic_ref<float>(*address).exchange(val); }
inline unsigned short atomicCAS(unsigned short* address, unsigned short compare, unsigned short val) {
  std::atomic_ref<unsigned short>(*address).compare_exchange_strong(compare, val, std::memory_order_acq_rel);
  return compare;
}

// CUDA's wrap-around increments: ((old >= limit) ? 0 : old + 1) and ((old == 0 || old > limit) ? limit : old - 1).
inline unsigned atomicInc(unsigned* address, unsigned limit) {
  return minidl::emu::detail::atomic_update(address, [limit](unsigned old) { return old >= limit ? 0u : old + 1; });
}
inline unsigned atomicDec(unsigned* address, unsigned limit) {
  return minidl::emu::detail::atomic_update(
      address, [limit](unsigned old) { return (old == 0 || old > limit) ? limit : old - 1; });
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
