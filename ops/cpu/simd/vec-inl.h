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
// last n % Lanes elements. The tail is a masked load and store (LoadPart/StorePart) where those touch only the
// lanes asked for, AVX2's and AVX-512's for 4- and 8-byte lanes; elsewhere (Highway's SSE4 and 16-bit AVX2
// MaskedLoad read the whole vector, past the end of the row) it goes through a zero-padded stack buffer.
template <class D, class Body>
HWY_INLINE void ForEachVector(D d, size_t n, const Body& body) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) body(i, N, FullVector{});
  if (i < n) body(i, n - i, TailVector{});
}

// Room for one vector of the widest target (AVX-512: 64 bytes).
constexpr size_t kMaxVectorBytes = 64;

// Whether MaskedLoad and BlendedStore leave the masked-off lanes' memory alone on this target (see above).
template <class T>
constexpr bool kMaskedTail = HWY_TARGET <= HWY_AVX2 && sizeof(T) >= 4;

template <class Part, class D, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, size_t count) {
  if constexpr (Part::value) {
    return hn::LoadU(d, p);
  } else if constexpr (kMaskedTail<T>) {
    return hn::MaskedLoad(hn::FirstN(d, count), d, p);  // zero in the other lanes
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
  } else if constexpr (kMaskedTail<T>) {
    hn::BlendedStore(v, hn::FirstN(d, count), d, p);
  } else {
    alignas(kMaxVectorBytes) T buf[kMaxVectorBytes / sizeof(T)];
    hn::Store(v, d, buf);
    std::memcpy(p, buf, count * sizeof(T));
  }
}

// v with the lanes past the data of a tail set to `fill`: reductions must not count the padding. Whole vectors
// pass through untouched (no mask instruction in the main loop).
template <class Part, class D, class V>
HWY_INLINE V PadWith(D d, size_t count, V v, V fill) {
  if constexpr (Part::value) {
    return v;
  } else {
    return hn::IfThenElse(hn::FirstN(d, count), v, fill);
  }
}

// Calls body(i, k) for k = 0..3 on four whole vectors at a time (i, i + N, ...), then returns where it stopped:
// reductions keep one accumulator per k, so consecutive iterations do not wait on one add's latency.
template <class D, class Body>
HWY_INLINE size_t ForEachFourVectors(D d, size_t n, const Body& body) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    body(i, 0);
    body(i + N, 1);
    body(i + 2 * N, 2);
    body(i + 3 * N, 3);
  }
  return i;
}

// exp(x) for x <= 0 (and -inf, NaN), the only arguments the kernels need: softmax, cross-entropy and attention
// take exp(x - max) or exp(x - logsumexp) (GELU's gate, and sums below AVX-512, take Exp2NonPositive below). Knowing
// the sign makes the range reduction cheap, about half of Highway's general Exp in instructions:
//   n = round(x log2 e): adding 1.5 * 2^23 (+ 64) to x log2 e leaves the integer n + 64 in the low mantissa bits;
//   r = x - n ln 2 in two parts (Cody-Waite, Highway's constants), |r| <= ln(2) / 2;
//   exp(r) = 1 + r (1 + r Q(r)), Q of degree 4 fitted for the least maximum relative error of exp on that
//   interval (3.9e-9, 0.06 ulp; Lawson's iteration on 2e5 points); Horner: 6 fused multiply-adds;
//   2^(n + 64) goes straight into the exponent bits (normal for every n >= -190), then one multiply by 2^-64
//   rounds the results below FLT_MIN (x < -87.3) to the right denormal, or to 0 below -103.9.
// Inputs are clamped at -110 (exp = 0 in float); x up to +43 would still be right, beyond it not. NaN in, NaN
// out. Error: within 2 ulp of exp in double (tests/ops/test_simd.cpp). Sums of exps take Exp2NonPositive below,
// without kTiny (ops/cpu/simd/rows.cpp).
template <size_t K, class D, class V>
HWY_INLINE void ExpNonPositive(D d, V (&x)[K]) {
  // K independent vectors advance in lock step: one exp is a chain of about 15 dependent instructions, and an
  // out-of-order window holds too few of them to overlap consecutive iterations on its own.
  const hn::RebindToSigned<D> di;
  const V magic = hn::Set(d, 12582912.0f + 64.0f);  // 1.5 * 2^23 + 64
  const V lo = hn::Set(d, -110.0f), log2e = hn::Set(d, 1.44269504088896341f);
  const V ln2_hi = hn::Set(d, -0.693145751953125f), ln2_lo = hn::Set(d, -1.428606765330187045e-6f);
  const V one = hn::Set(d, 1.0f);
  V xc[K], t[K], r[K], q[K];
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) {
    xc[k] = hn::Max(x[k], lo);
    t[k] = hn::MulAdd(xc[k], log2e, magic);
  }
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) {
    const V n = hn::Sub(t[k], magic);
    r[k] = hn::MulAdd(n, ln2_hi, xc[k]);
    r[k] = hn::MulAdd(n, ln2_lo, r[k]);
    q[k] = hn::MulAdd(hn::Set(d, 0.001381455222144723f), r[k], hn::Set(d, 0.008368694223463535f));
  }
  const float c[] = {0.04166838526725769f, 0.1666652113199234f, 0.4999999403953552f};
  for (float ci : c) {
    const V vc = hn::Set(d, ci);
#pragma GCC unroll 8
    for (size_t k = 0; k < K; ++k) q[k] = hn::MulAdd(q[k], r[k], vc);
  }
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) {
    const V p = hn::MulAdd(hn::MulAdd(q[k], r[k], one), r[k], one);
    const auto scaled = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t[k])));
    const V y = hn::Mul(hn::BitCast(d, scaled), hn::Set(d, 5.42101086242752217e-20f));  // 2^-64
    x[k] = hn::IfThenElse(hn::IsNaN(x[k]), x[k], y);
  }
}

template <class D, class V>
HWY_INLINE V ExpNonPositive(D d, V x) {
  V one[1] = {x};
  ExpNonPositive(d, one);
  return one[0];
}

// 2^y for y <= 0, for callers that can take their argument in base 2: GELU's gate folds log2 e into its own
// polynomial (u's coefficients), and a sum of exps (exp_sub_sum without stores, cross-entropy's logsumexp) takes
// (x - m) log2 e, whose rounding moves each term by at most e^-a a 2^-24 <= 0.37 x 2^-24 of the sum's largest
// term, 1 (a = m - x). The range reduction is then three adds, exact, instead of ExpNonPositive's multiply and two
// fused multiply-adds:
//   t = y + 1.5 * 2^23 (+ 64) leaves round(y) (+ 64) in the low mantissa bits, n = round(y) = t - magic,
//   r = y - n, exactly (|r| <= 1/2);
//   2^r = 1 + r P(r), P of degree 4 fitted for the least maximum relative error of 2^r on [-1/2, 1/2] (9.2e-8,
//   0.8 ulp; Lawson's iteration on 2e5 points), by Horner's scheme where the target has fused multiply-adds (AVX2,
//   AVX-512) and Estrin's elsewhere (SSE4: a multiply and an add each, and Horner's chain of them is twice as
//   long). Horner against Estrin, 1 thread, AMD EPYC family 25 model 17: exps summed per second 5.55 G against
//   4.53 G on AVX2, 7.09 G against 6.70 G on AVX-512; GELU 28.0 against 26.7 GB/s on AVX-512, equal on AVX2; SSE4
//   GELU 6.8 against 7.5 GB/s;
//   kTiny: 2^(n + 64) into the exponent bits, then one multiply by 2^-64 rounds the results below FLT_MIN to
//   their denormal, or to 0 below 2^-150; y is clamped at -158 (2^y = 0 in float). Without kTiny (for sums of
//   exps, rows.cpp's SumExp2), y is clamped at -124 and 2^n goes straight into the exponent bits: below
//   2^-124 = 4.7e-38 the result is 4.7e-38.
// NaN gives a number, not NaN: the callers see their NaN elsewhere (GELU's in x itself, the sums' in a sum of
// the arguments).
// In AVX2 code the loops that call this wait on the multiply-add pipes (two of the four on a Zen core, llvm-mca
// -mcpu=znver3), and adds run on the other two: 6 multiplies or multiply-adds per exp here (5 without kTiny),
// 10 in ExpNonPositive with its two-step reduction by ln 2. With it and GeluGate's Newton step and sign select,
// GELU forward ran 1.43x as fast on AVX2 (AMD EPYC family 25 model 17, November 2026).
template <bool kTiny = true, size_t K, class D, class V>
HWY_INLINE void Exp2NonPositive(D d, V (&y)[K]) {
  const hn::RebindToSigned<D> di;
  const V magic = hn::Set(d, 12582912.0f + (kTiny ? 64.0f : 0.0f)), lo = hn::Set(d, kTiny ? -158.0f : -124.0f);
  const V one = hn::Set(d, 1.0f), c1 = hn::Set(d, 0.6931470036506653f), c2 = hn::Set(d, 0.24022242426872253f);
  const V c3 = hn::Set(d, 0.05550733581185341f), c4 = hn::Set(d, 0.009671509265899658f);
  const V c5 = hn::Set(d, 0.0013264714507386088f);
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) {
    const V yc = hn::Max(y[k], lo);
    const V t = hn::Add(yc, magic);
    const V r = hn::Sub(yc, hn::Sub(t, magic));
    V p;
    if constexpr (HWY_NATIVE_FMA) {  // Horner: 5 multiply-adds
      p = hn::MulAdd(hn::MulAdd(hn::MulAdd(hn::MulAdd(hn::MulAdd(c5, r, c4), r, c3), r, c2), r, c1), r, one);
    } else {  // Estrin: a multiply and 5 multiply-adds, in a shorter chain of multiplies and adds
      const V r2 = hn::Mul(r, r);
      const V high = hn::MulAdd(hn::MulAdd(c5, r, c4), r2, hn::MulAdd(c3, r, c2));
      p = hn::MulAdd(high, r2, hn::MulAdd(c1, r, one));
    }
    const auto scaled = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t)));
    y[k] = hn::BitCast(d, scaled);
    if constexpr (kTiny) y[k] = hn::Mul(y[k], hn::Set(d, 5.42101086242752217e-20f));  // 2^-64
  }
}

// GELU's gate s = sigmoid(2u) = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) (ops/kernels/gelu.h), and
// its complement 1 - s, both from e = exp(-2|u|) <= 1: with q = 1 / (1 + e), s = q and 1 - s = e q for x >= 0,
// the other way round for x < 0 (by x's sign bit: -0 gives e = 1 and s = 1 - s = 1/2 either way). No exp
// overflows and 1 - s never cancels. u has the sign of x; e is 2^(-|x| (a + b x^2)) with a = 2 sqrt(2/pi) log2 e
// and b = 0.044715 a. K vectors at a time, as ExpNonPositive. 1 / (1 + e) is a division on AVX-512, whose CPUs
// divide 16 floats in fewer cycles than this loop spends per vector (AMD EPYC family 25 model 17, 1 thread, rows in
// L2: GELU 27.9 -> 29.1 GB/s, its gradient 29.0 -> 29.6 against the Newton step below), and on SSE4 too. On AVX2,
// the reciprocal estimate refined by one fused Newton step (about 1 ulp): a Zen 2 or Haswell divides a 256-bit
// vector in 2-3 times the cycles of a Zen 4, where the division would be the loop's slowest part (on the Zen 4 the
// division also ran AVX2's GELU 1.04x as fast, which a Zen 2 may not repeat). SSE4 has no fused multiply-add, so
// its Newton step rounds twice more, and the estimate it refines is the vendor's own table (rcpps): on an Intel
// Xeon (family 6 model 167) it reached 1.009 of GELU's 4-ulp bound at x = 0.66, where AMD's read 0.99; the
// division is exact on every vendor, and ran SSE4's GELU 1.12x as fast on the Zen 4.
template <size_t K, class D, class V>
HWY_INLINE void GeluGate(D d, const V (&x)[K], V (&s)[K], V (&one_minus_s)[K]) {
  constexpr double kA = 2.0 * 0.7978845608028654 * 1.4426950408889634;
  const V a = hn::Set(d, float(kA)), b = hn::Set(d, float(kA * 0.044715));
  const V one = hn::Set(d, 1.0f), neg_zero = hn::Set(d, -0.0f);
  V e[K];
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) e[k] = hn::Mul(hn::Or(x[k], neg_zero), hn::MulAdd(hn::Mul(x[k], x[k]), b, a));
  Exp2NonPositive(d, e);
#pragma GCC unroll 8
  for (size_t k = 0; k < K; ++k) {
    const V den = hn::Add(one, e[k]);  // in [1, 2]
    V q;
    if constexpr (HWY_TARGET == HWY_AVX2) {
      q = hn::ApproximateReciprocal(den);
      q = hn::MulAdd(q, hn::NegMulAdd(den, q, one), q);
    } else {
      q = hn::Div(one, den);
    }
    const V eq = hn::Mul(e[k], q);
    s[k] = hn::IfNegativeThenElse(x[k], eq, q);
    one_minus_s[k] = hn::IfNegativeThenElse(x[k], q, eq);
  }
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
