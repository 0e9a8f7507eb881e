// intrinsics.h — host versions of CUDA's device-only math and bit intrinsics (included by emulator.h).
//
// The fast-math intrinsics (__expf, __fdividef, ...) are computed at full float precision here; GPU results
// differ in the last bits, so tests compare with tolerances, never with GPU bits. 16-bit float math goes
// through float and rounds once, like the GPU's f32-internal implementations. Everything <cuda_fp16.h> and
// <cuda_bf16.h> already offer in host code (conversions, __hadd, __hmax, operators, ...) comes from there.
#pragma once

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- float ----
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x), *c = std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x > 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }  // NaN -> 0, as on GPU
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }

// ---- conversions and reinterpretation ----
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

// ---- integer bits ----
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i, x >>= 1) r = (r << 1) | (x & 1u);
  return r;
}
inline unsigned __umulhi(unsigned x, unsigned y) { return static_cast<unsigned>((uint64_t{x} * y) >> 32); }
inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(x) * y) >> 64);
}

// ---- min/max: CUDA declares these overloads at global scope for host and device code ----
#define MINIDL_EMU_MINMAX(T)                       \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
MINIDL_EMU_MINMAX(int)
MINIDL_EMU_MINMAX(unsigned)
MINIDL_EMU_MINMAX(long long)
MINIDL_EMU_MINMAX(unsigned long long)
#undef MINIDL_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }

// ---- cache-hinted loads and stores: plain memory accesses on the host ----
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}

inline long long clock64() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
inline void __nanosleep(unsigned) {}

// ---- 16-bit floats: the math functions cuda_fp16.h / cuda_bf16.h declare for device code only ----
#define MINIDL_EMU_HALF_UNARY(name, expr)      \
  inline __half name(__half h) {               \
    const float x = __half2float(h);           \
    return __float2half(expr);                 \
  }                                            \
  inline __nv_bfloat16 name(__nv_bfloat16 h) { \
    const float x = __bfloat162float(h);       \
    return __float2bfloat16(expr);             \
  }
MINIDL_EMU_HALF_UNARY(hexp, std::exp(x))
MINIDL_EMU_HALF_UNARY(hexp2, std::exp2(x))
MINIDL_EMU_HALF_UNARY(hlog, std::log(x))
MINIDL_EMU_HALF_UNARY(hlog2, std::log2(x))
MINIDL_EMU_HALF_UNARY(hsqrt, std::sqrt(x))
MINIDL_EMU_HALF_UNARY(hrsqrt, 1.0f / std::sqrt(x))
MINIDL_EMU_HALF_UNARY(hrcp, 1.0f / x)
MINIDL_EMU_HALF_UNARY(htanh, std::tanh(x))
MINIDL_EMU_HALF_UNARY(hsin, std::sin(x))
MINIDL_EMU_HALF_UNARY(hcos, std::cos(x))
MINIDL_EMU_HALF_UNARY(hfloor, std::floor(x))
MINIDL_EMU_HALF_UNARY(hceil, std::ceil(x))
MINIDL_EMU_HALF_UNARY(htrunc, std::trunc(x))
#undef MINIDL_EMU_HALF_UNARY

inline __half __hfma(__half a, __half b, __half c) {
  return __float2half(std::fma(__half2float(a), __half2float(b), __half2float(c)));
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __float2bfloat16(std::fma(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}

// Pairs: each half through the scalar function.
#define MINIDL_EMU_HALF2_UNARY(name, scalar)                                                               \
  inline __half2 name(__half2 h) { return __halves2half2(scalar(__low2half(h)), scalar(__high2half(h))); } \
  inline __nv_bfloat162 name(__nv_bfloat162 h) {                                                           \
    return __halves2bfloat162(scalar(__low2bfloat16(h)), scalar(__high2bfloat16(h)));                      \
  }
MINIDL_EMU_HALF2_UNARY(h2exp, hexp)
MINIDL_EMU_HALF2_UNARY(h2log, hlog)
MINIDL_EMU_HALF2_UNARY(h2sqrt, hsqrt)
MINIDL_EMU_HALF2_UNARY(h2rsqrt, hrsqrt)
#undef MINIDL_EMU_HALF2_UNARY

inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __halves2half2(__hfma(__low2half(a), __low2half(b), __low2half(c)),
                        __hfma(__high2half(a), __high2half(b), __high2half(c)));
}
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return __halves2bfloat162(__hfma(__low2bfloat16(a), __low2bfloat16(b), __low2bfloat16(c)),
                            __hfma(__high2bfloat16(a), __high2bfloat16(b), __high2bfloat16(c)));
}
