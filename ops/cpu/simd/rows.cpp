// Row kernels of softmax, cross-entropy, attention and layer norm: max, exp-and-sum, scale, dot, and the two
// layer-norm passes. Each reduces in vector lanes and adds the lanes at the end, so a row's result depends on the
// ISA's vector width but never on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/rows.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/cpu/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {

float MaxRow(const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  hn::Vec<decltype(d)> acc[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  const size_t done = ForEachFourVectors(d, n, [&](size_t i, int k) { acc[k] = hn::Max(acc[k], hn::LoadU(d, x + i)); });
  ForEachVector(d, n - done, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    acc[0] = hn::Max(acc[0], PadWith<Part>(d, count, LoadPart<Part>(d, x + done + i, count), neg_inf));
  });
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(acc[0], acc[1]), hn::Max(acc[2], acc[3]))));
}

// Prefetches the cache lines of next[begin, end) not yet asked for: one per 64 bytes, so a caller that passes
// consecutive spans as it works through its own row spreads the next row's prefetches over that work.
HWY_INLINE void PrefetchSpan(const float* next, size_t begin, size_t end) {
  constexpr size_t kLine = 16;  // floats per 64-byte cache line
  if (next)
    for (size_t j = (begin + kLine - 1) / kLine * kLine; j < end; j += kLine) hwy::Prefetch(next + j);
}

// e[0] + e[1] + ...
template <class V, size_t K>
HWY_INLINE V SumOf(const V (&e)[K]) {
  V s = e[0];
  for (size_t k = 1; k < K; ++k) s = hn::Add(s, e[k]);
  return s;
}

// Two vectors per step: the exps interleave (ExpNonPositive), within the 16 vector registers of AVX2.
constexpr size_t kUnroll = 2;
constexpr float kLog2e = 1.44269504088896341f;

// y = exp(x - m) and their sum (softmax's rows, attention's scores). The sum alone goes to SumExp2 below.
float ExpSubStore(const float* x, float m, float* y, size_t n, const float* next) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const V vm = hn::Set(d, m);
  // One accumulator, fed the pairwise sum of a step's vectors: AVX2's 16 registers hold the exp's constants, and a
  // second accumulator went to the stack, its store and reload on the loop's critical path.
  V sum = hn::Zero(d);
  size_t i = 0;
  for (; i + kUnroll * N <= n; i += kUnroll * N) {
    PrefetchSpan(next, i, i + kUnroll * N);  // the same span of the next row, spread over the exps
    V e[kUnroll];
    for (size_t k = 0; k < kUnroll; ++k) e[k] = hn::Sub(hn::LoadU(d, x + i + k * N), vm);
    ExpNonPositive(d, e);
    for (size_t k = 0; k < kUnroll; ++k) hn::StoreU(e[k], d, y + i + k * N);
    sum = hn::Add(sum, SumOf(e));
  }
  ForEachVector(d, n - i, [&](size_t j, size_t count, auto part) {
    using Part = decltype(part);
    V e[1] = {hn::Sub(LoadPart<Part>(d, x + i + j, count), vm)};
    ExpNonPositive(d, e);
    StorePart<Part>(e[0], d, y + i + j, count);
    sum = hn::Add(sum, PadWith<Part>(d, count, e[0], hn::Zero(d)));
  });
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// A sum of exps alone (cross-entropy's forward, through LogSumExpRow) is taken in base 2, where the target has
// fused multiply-adds against a base-2 point c = m L rounded to float (L = log2 e in float): S = sum 2^(x L - c),
// each argument one multiply-add and each power Exp2NonPositive without kTiny, where x - m, a multiply and
// ExpNonPositive cost an add and a multiply more per vector. Exps summed per second, 1 thread, rows in L1 (AMD
// EPYC family 25 model 17): AVX2 4.49 -> 5.55 G, AVX-512 6.03 -> 7.09 G. Writing L = (1 + d) log2 e, the terms are
// exp((x - p)(1 + d)) at the point p = c / L, those of the old (x - m) L but against p instead of m: *point gets p
// (in double), and the callers take it back exactly (ExpSubSum's factor exp((p - m)(1 + d)), LogSumExpRow's
// p + log S). Each argument rounds once, as x - m and then a multiply did. Without fused multiply-adds (SSE4) x L
// would round before c is subtracted, so the arguments stay (x - m) L, and p = m.
// The exps skip the NaN lanes and a NaN anywhere shows in a second sum, of the arguments themselves: they are all
// finite or -inf unless one is NaN (x or m NaN, or x = m = +-inf), so that sum is NaN exactly when one of them is.
// Arguments below -124 give 4.7e-38 rather than their tiny values, which the callers' sums cannot see: each holds,
// or is added to a sum that holds, 2^((max - p) L), about 1. Arguments up to +127 are right (Exp2NonPositive
// without kTiny), so LogSumExpRow's guessed point may sit up to 64 below the max.
// With kMax, *max gets the max of x beside the exps (LogSumExpRow).
template <bool kMax>
float SumExp2(const float* x, float m, size_t n, const float* next, float* max, double* point) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const float c = m * kLog2e;
  *point = HWY_NATIVE_FMA ? double(c) / double(kLog2e) : double(m);
  const V log2e = hn::Set(d, kLog2e), vm = hn::Set(d, m), neg_c = hn::Set(d, -c);
  const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto arg = [&](V v) {
    if constexpr (HWY_NATIVE_FMA) return hn::MulAdd(v, log2e, neg_c);
    return hn::Mul(hn::Sub(v, vm), log2e);
  };
  V vmax = neg_inf, sum = hn::Zero(d), args = hn::Zero(d);  // one accumulator each, as ExpSubStore's
  size_t i = 0;
  for (; i + kUnroll * N <= n; i += kUnroll * N) {
    PrefetchSpan(next, i, i + kUnroll * N);
    V e[kUnroll];
    for (size_t k = 0; k < kUnroll; ++k) {
      const V v = hn::LoadU(d, x + i + k * N);
      if constexpr (kMax) vmax = hn::Max(vmax, v);
      e[k] = arg(v);
    }
    args = hn::Add(args, SumOf(e));
    Exp2NonPositive<false>(d, e);
    sum = hn::Add(sum, SumOf(e));
  }
  ForEachVector(d, n - i, [&](size_t j, size_t count, auto part) {
    using Part = decltype(part);
    const V v = PadWith<Part>(d, count, LoadPart<Part>(d, x + i + j, count), neg_inf);
    if constexpr (kMax) vmax = hn::Max(vmax, v);
    V e[1] = {PadWith<Part>(d, count, arg(v), neg_inf)};  // padding: 2^-inf, sums kept
    args = hn::Add(args, e[0]);
    Exp2NonPositive<false>(d, e);
    sum = hn::Add(sum, PadWith<Part>(d, count, e[0], hn::Zero(d)));
  });
  if constexpr (kMax) *max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (std::isnan(hn::GetLane(hn::SumOfLanes(d, args)))) return std::numeric_limits<float>::quiet_NaN();
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// Where m L is far from the ends of float's range, SumExp2's point; beyond (|m| >= 2^100, never a logit), a sum in
// double, element by element.
HWY_INLINE bool Base2PointFits(float m) { return std::fabs(m) < 0x1p100f; }

double SumExpScalar(const float* x, double m, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return s;
}

float ExpSubSum(const float* x, float m, float* y, size_t n, const float* next) {
  if (y) return ExpSubStore(x, m, y, n, next);
  if (!Base2PointFits(m)) return float(SumExpScalar(x, m, n));  // also m = +-inf or NaN
  double p;
  const float s = SumExp2<false>(x, m, n, next, nullptr, &p);
  return float(double(s) * std::exp2((p - double(m)) * double(kLog2e)));
}

// log sum exp(x) in one pass over x where it can. The exps are taken against a guess of the max, that of the first
// four vectors, while the true max accumulates beside them; the guess is kept if the max is within kHeadroom of it
// (exp(64) x 2^31 terms stays below FLT_MAX, and SumExp2's powers are right up to 2^127), and otherwise the row is
// summed again against its max. The rounding is that of the two-pass sum: one exp per element and a float sum,
// only scaled by a power of 2. A row of -inf gives -inf; a NaN or +inf anywhere gives NaN.
constexpr float kHeadroom = 64.0f;

float LogSumExpRow(const float* x, size_t n) {
  const float kInf = std::numeric_limits<float>::infinity();
  const auto log_sum = [](float s, double p) { return std::isnan(s) ? s : float(p + std::log(double(s))); };
  const auto has_nan = [&] { return std::any_of(x, x + n, [](float v) { return std::isnan(v); }); };
  const float guess = MaxRow(x, std::min(n, 4 * hn::Lanes(hn::ScalableTag<float>())));
  if (Base2PointFits(guess)) {  // finite (a NaN fails too)
    float max = guess;
    double p;
    const float s = SumExp2<true>(x, guess, n, nullptr, &max, &p);
    if (max <= guess + kHeadroom) return log_sum(s, p);  // else s may have overflowed: again against the max
  }
  const float max = MaxRow(x, n);  // not a NaN's: SumExp2 catches those
  if (max == -kInf)                // -inf and NaN only (MaxRow may drop a NaN)
    return has_nan() ? std::numeric_limits<float>::quiet_NaN() : -kInf;
  if (!Base2PointFits(max)) {  // +inf, or logits beyond 2^100: NaN, or the sum in double
    if (max == kInf || has_nan()) return std::numeric_limits<float>::quiet_NaN();
    return float(double(max) + std::log(SumExpScalar(x, max, n)));
  }
  double p;
  const float s = SumExp2<false>(x, max, n, nullptr, nullptr, &p);
  return log_sum(s, p);
}

void ExpSubScale(const float* x, float m, float scale, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const auto vm = hn::Set(d, m), vs = hn::Set(d, scale);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto e = ExpNonPositive(d, hn::Sub(LoadPart<Part>(d, x + i, count), vm));
    StorePart<Part>(hn::Mul(e, vs), d, y + i, count);
  });
}

void ScaleRow(float* y, float s, size_t n) {
  const hn::ScalableTag<float> d;
  const auto vs = hn::Set(d, s);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    StorePart<Part>(hn::Mul(LoadPart<Part>(d, y + i, count), vs), d, y + i, count);
  });
}

float DotRow(const float* a, const float* b, size_t n) {
  const hn::ScalableTag<float> d;
  hn::Vec<decltype(d)> sum[4] = {hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
  const size_t done = ForEachFourVectors(
      d, n, [&](size_t i, int k) { sum[k] = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum[k]); });
  ForEachVector(d, n - done, [&](size_t i, size_t count, auto part) {  // a tail's zero padding adds 0 * 0
    using Part = decltype(part);
    const size_t j = done + i;
    sum[0] = hn::MulAdd(LoadPart<Part>(d, a + j, count), LoadPart<Part>(d, b + j, count), sum[0]);
  });
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(sum[0], sum[1]), hn::Add(sum[2], sum[3]))));
}

void MulSubRow(const float* y, const float* dy, float c, float* dx, size_t n) {
  const hn::ScalableTag<float> d;
  const auto vc = hn::Set(d, c);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto r = hn::Mul(LoadPart<Part>(d, y + i, count), hn::Sub(LoadPart<Part>(d, dy + i, count), vc));
    StorePart<Part>(r, d, dx + i, count);
  });
}

// Statistics in double, as the scalar reference: a float sum of a long row loses digits. Each load takes as many
// floats as a vector holds doubles and widens them; the tail (fewer than one vector) is added in scalar double.
void LayerNormForwardRow(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, double eps,
                         size_t n, const float* next) {
  const hn::ScalableTag<float> d;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // floats widened one double vector at a time
  const size_t N = hn::Lanes(dd), whole = n / N * N, whole4 = n / (4 * N) * (4 * N);
  const auto widen = [&](size_t i) { return hn::PromoteTo(dd, hn::LoadU(df, x + i)); };
  hn::Vec<decltype(dd)> s[4] = {hn::Zero(dd), hn::Zero(dd), hn::Zero(dd), hn::Zero(dd)};
  for (size_t i = 0; i < whole4; i += 4 * N) {
    PrefetchSpan(y, i, i + 4 * N);  // y's lines, so the last pass's stores do not wait on them
    for (size_t k = 0; k < 4; ++k) s[k] = hn::Add(s[k], widen(i + k * N));
  }
  for (size_t i = whole4; i < whole; i += N) s[0] = hn::Add(s[0], widen(i));
  double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(s[0], s[1]), hn::Add(s[2], s[3]))));
  for (size_t i = whole; i < n; ++i) sum += x[i];
  const double mu = sum / double(n);
  const auto vmu = hn::Set(dd, mu);
  hn::Vec<decltype(dd)> ss[4] = {hn::Zero(dd), hn::Zero(dd), hn::Zero(dd), hn::Zero(dd)};
  const auto square = [&](size_t i, size_t k) {
    const auto dev = hn::Sub(widen(i), vmu);
    ss[k] = hn::MulAdd(dev, dev, ss[k]);
  };
  for (size_t i = 0; i < whole4; i += 4 * N) {
    PrefetchSpan(next, i, i + 4 * N);  // the next row, while this pass runs on cached data
    for (size_t k = 0; k < 4; ++k) square(i + k * N, k);
  }
  for (size_t i = whole4; i < whole; i += N) square(i, 0);
  double sq = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(ss[0], ss[1]), hn::Add(ss[2], ss[3]))));
  for (size_t i = whole; i < n; ++i) sq += (x[i] - mu) * (x[i] - mu);
  const float m = float(mu), rs = float(1.0 / std::sqrt(sq / double(n) + eps));
  const auto vm = hn::Set(d, m), vrs = hn::Set(d, rs);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto xhat = hn::Mul(hn::Sub(LoadPart<Part>(d, x + i, count), vm), vrs);
    const auto r = hn::MulAdd(xhat, LoadPart<Part>(d, w + i, count), LoadPart<Part>(d, b + i, count));
    StorePart<Part>(r, d, y + i, count);
  });
  *mean = m;
  *rstd = rs;
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w, then + dsum (if not null) as a separate rounding, the
// add the fused add-layernorm's backward needs; dw += dy xhat; db += dy. Padding lanes hold x = dy = 0, so they
// add nothing to the sums.
void LayerNormBackwardRow(const float* dy, const float* x, const float* w, float mean, float rstd, float* dx, float* dw,
                          float* db, size_t n, const float* dsum) {
  const hn::ScalableTag<float> d;
  const auto vm = hn::Set(d, mean), vrs = hn::Set(d, rstd);
  auto sum_g = hn::Zero(d), sum_gx = hn::Zero(d);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto vdy = LoadPart<Part>(d, dy + i, count);
    const auto xhat = hn::Mul(hn::Sub(LoadPart<Part>(d, x + i, count), vm), vrs);
    const auto g = hn::Mul(vdy, LoadPart<Part>(d, w + i, count));
    sum_g = hn::Add(sum_g, g);
    sum_gx = hn::MulAdd(g, xhat, sum_gx);
    StorePart<Part>(hn::MulAdd(vdy, xhat, LoadPart<Part>(d, dw + i, count)), d, dw + i, count);
    StorePart<Part>(hn::Add(LoadPart<Part>(d, db + i, count), vdy), d, db + i, count);
  });
  const float mean_g = hn::GetLane(hn::SumOfLanes(d, sum_g)) / float(n);
  const float mean_gx = hn::GetLane(hn::SumOfLanes(d, sum_gx)) / float(n);
  const auto vmg = hn::Set(d, mean_g), vmgx = hn::Set(d, mean_gx);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto xhat = hn::Mul(hn::Sub(LoadPart<Part>(d, x + i, count), vm), vrs);
    const auto g = hn::Mul(LoadPart<Part>(d, dy + i, count), LoadPart<Part>(d, w + i, count));
    auto r = hn::Mul(vrs, hn::NegMulAdd(xhat, vmgx, hn::Sub(g, vmg)));
    if (dsum) r = hn::Add(r, LoadPart<Part>(d, dsum + i, count));
    StorePart<Part>(r, d, dx + i, count);
  });
}

// dst[i] += x[0, i], then += x[1, i], ... row by row (rows ld apart), each column in registers for all the rows: a
// column sum (a bias gradient) in the order of the scalar loop, where that loop kept dst in memory and waited on its
// own stores.
void AddRows(const float* x, size_t rows, size_t ld, float* dst, size_t n) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    V acc[4];
    for (size_t k = 0; k < 4; ++k) acc[k] = hn::LoadU(d, dst + i + k * N);
    for (size_t r = 0; r < rows; ++r)
      for (size_t k = 0; k < 4; ++k) acc[k] = hn::Add(acc[k], hn::LoadU(d, x + r * ld + i + k * N));
    for (size_t k = 0; k < 4; ++k) hn::StoreU(acc[k], d, dst + i + k * N);
  }
  ForEachVector(d, n - i, [&](size_t j, size_t count, auto part) {
    using Part = decltype(part);
    V acc = LoadPart<Part>(d, dst + i + j, count);
    for (size_t r = 0; r < rows; ++r) acc = hn::Add(acc, LoadPart<Part>(d, x + r * ld + i + j, count));
    StorePart<Part>(acc, d, dst + i + j, count);
  });
}

// Attention's row loops, a tile in one call, where the tile called through the dispatch table once per row and
// function: a 64 x 64 causal tile's max and exps 2.2-2.3 -> 1.6 us, against 1.4-1.6 us for each of its products;
// baby attention's forward 0.293 -> 0.255 ms, backward 0.502 -> 0.493 (bench_attention, 1 thread, AVX2, AMD EPYC
// family 25 model 17). Row r of a tile sees its first Visible(r) columns (simd.h).
HWY_INLINE size_t Visible(size_t r, int64_t diag, size_t cols) {
  return size_t(std::clamp<int64_t>(int64_t(r) + diag + 1, 0, int64_t(cols)));
}

void CausalRowsMax(const float* s, size_t ld, size_t rows, size_t cols, int64_t diag, float* max) {
  for (size_t r = 0; r < rows; ++r) max[r] = MaxRow(s + r * ld, Visible(r, diag, cols));
}

void CausalRowsExp(float* s, size_t ld, size_t rows, size_t cols, int64_t diag, const float* m, float* sum) {
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const size_t n = Visible(r, diag, cols);
    const float t = ExpSubStore(row, m[r], row, n, nullptr);
    if (sum) sum[r] = t;
    std::fill(row + n, row + cols, 0.0f);
  }
}

void CausalRowsMulSub(const float* p, float* dp, size_t ld, size_t rows, size_t cols, int64_t diag, const float* c) {
  for (size_t r = 0; r < rows; ++r) {
    const size_t n = Visible(r, diag, cols);
    MulSubRow(p + r * ld, dp + r * ld, c[r], dp + r * ld, n);
    std::fill(dp + r * ld + n, dp + r * ld + cols, 0.0f);
  }
}

void DotRows(const float* a, size_t lda, const float* b, size_t ldb, size_t rows, size_t n, float* out) {
  for (size_t r = 0; r < rows; ++r) out[r] = DotRow(a + r * lda, b + r * ldb, n);
}

void ScaleRows(float* y, size_t ld, size_t rows, size_t n, const float* s) {
  for (size_t r = 0; r < rows; ++r) ScaleRow(y + r * ld, s[r], n);
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops::simd {

HWY_EXPORT(MaxRow);
HWY_EXPORT(ExpSubSum);
HWY_EXPORT(LogSumExpRow);
HWY_EXPORT(ExpSubScale);
HWY_EXPORT(ScaleRow);
HWY_EXPORT(DotRow);
HWY_EXPORT(AddRows);
HWY_EXPORT(MulSubRow);
HWY_EXPORT(LayerNormForwardRow);
HWY_EXPORT(LayerNormBackwardRow);
HWY_EXPORT(CausalRowsMax);
HWY_EXPORT(CausalRowsExp);
HWY_EXPORT(CausalRowsMulSub);
HWY_EXPORT(DotRows);
HWY_EXPORT(ScaleRows);

float max_row(const float* x, int64_t n) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(MaxRow)(x, size_t(n));
}
float exp_sub_sum(const float* x, float m, float* y, int64_t n, const float* next) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(ExpSubSum)(x, m, y, size_t(n), next);
}
float logsumexp_row(const float* x, int64_t n) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(LogSumExpRow)(x, size_t(n));
}
void exp_sub_scale(const float* x, float m, float scale, float* y, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(ExpSubScale)(x, m, scale, y, size_t(n));
}
void scale_row(float* y, float s, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(ScaleRow)(y, s, size_t(n));
}
float dot_row(const float* a, const float* b, int64_t n) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(DotRow)(a, b, size_t(n));
}
void add_rows(const float* x, int64_t rows, int64_t ld, float* dst, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(AddRows)(x, size_t(rows), size_t(ld), dst, size_t(n));
}
void mul_sub_row(const float* y, const float* dy, float c, float* dx, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(MulSubRow)(y, dy, c, dx, size_t(n));
}
void layernorm_forward_row(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           double eps, int64_t n, const float* next) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(LayerNormForwardRow)(x, w, b, y, mean, rstd, eps, size_t(n), next);
}
void layernorm_backward_row(const float* dy, const float* x, const float* w, float mean, float rstd, float* dx,
                            float* dw, float* db, int64_t n, const float* dsum) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(LayerNormBackwardRow)(dy, x, w, mean, rstd, dx, dw, db, size_t(n), dsum);
}

void causal_rows_max(const float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, float* max) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(CausalRowsMax)(s, size_t(ld), size_t(rows), size_t(cols), diag, max);
}
void causal_rows_exp(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const float* m, float* sum) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(CausalRowsExp)(s, size_t(ld), size_t(rows), size_t(cols), diag, m, sum);
}
void causal_rows_mul_sub(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag,
                         const float* c) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(CausalRowsMulSub)(p, dp, size_t(ld), size_t(rows), size_t(cols), diag, c);
}
void dot_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t n, float* out) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(DotRows)(a, size_t(lda), b, size_t(ldb), size_t(rows), size_t(n), out);
}
void scale_rows(float* y, int64_t ld, int64_t rows, int64_t n, const float* s) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(ScaleRows)(y, size_t(ld), size_t(rows), size_t(n), s);
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
