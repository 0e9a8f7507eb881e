// Per-target helpers of the ops/cpu/simd kernels: a loop over whole vectors and one padded tail, and an exp with
// IEEE edge cases. Re-included once per target by hwy/foreach_target.h (hence the toggling include guard).
#if defined(MINIDL_OPS_CPU_SIMD_VEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MINIDL_OPS_CPU_SIMD_VEC_INL_H_
#undef MINIDL_OPS_CPU_SIMD_VEC_INL_H_
#else
#define MINIDL_OPS_CPU_SIMD_VEC_INL_H_
#endif

#include <cstring>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using FullVector = std::true_type;
using TailVector = std::false_type;

// Calls body(i, count, FullVector{}) for each whole vector at i, then body(i, count, TailVector{}) once for the
// last n % Lanes elements. The tail goes through a zero-padded stack buffer (LoadPart/StorePart), not a masked
// load: Highway's SSE4 and portable MaskedLoad read the whole vector, past the end of the row.
template <class D, class Body>
HWY_INLINE void ForEachVector(D d, size_t n, const Body& body) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) body(i, N, FullVector{});
  if (i < n) body(i, n - i, TailVector{});
}

// Room for one vector of the widest target (AVX-512: 64 bytes).
constexpr size_t kMaxVectorBytes = 64;

template <class Part, class D, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, size_t count) {
  if constexpr (Part::value) {
    return hn::LoadU(d, p);
  } else {
    alignas(kMaxVectorBytes) T buf[kMaxVectorBytes / sizeof(T)] = {};
    std::memcpy(buf, p, count * sizeof(T));
    return hn::Load(d, buf);
  }
}

template <class Part, class D, class T = hn::TFromD<D>>
HWY_INLINE void StorePart(hn::Vec<D> v, D d, T* p, size_t count) {
  if constexpr (Part::value) {
    hn::StoreU(v, d, p);
  } else {
    alignas(kMaxVectorBytes) T buf[kMaxVectorBytes / sizeof(T)];
    hn::Store(v, d, buf);
    std::memcpy(p, buf, count * sizeof(T));
  }
}

// The lanes of a tail that hold data: reductions must not count the padding.
template <class Part, class D>
HWY_INLINE hn::Mask<D> ValidLanes(D d, size_t count) {
  return hn::FirstN(d, Part::value ? hn::Lanes(d) : count);
}

// exp(x) for f32 lanes: Highway's Exp (1 ulp) is only defined up to ln(FLT_MAX) and maps NaN to 0, so clamp its
// input and restore +inf above the range and NaN for NaN. Below -104 it returns 0, as exp(-inf) must.
template <class D, class V>
HWY_INLINE V ExpIeee(D d, V x) {
  const V hi = hn::Set(d, 88.72283935546875f);  // ln(FLT_MAX) rounded down to float
  V y = hn::Exp(d, hn::Min(x, hi));
  y = hn::IfThenElse(hn::Gt(x, hi), hn::Inf(d), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

// GELU's gate sigmoid(2u) = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): ops/kernels/gelu.h.
template <class D, class V>
HWY_INLINE V GeluGate(D d, V x) {
  const V k0 = hn::Set(d, 0.7978845608028654f), k1 = hn::Set(d, 0.044715f);
  const V one = hn::Set(d, 1.0f);
  V u = hn::Mul(k0, hn::MulAdd(hn::Mul(hn::Mul(k1, x), x), x, x));
  return hn::Div(one, hn::Add(one, ExpIeee(d, hn::Mul(hn::Set(d, -2.0f), u))));
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
