// RMS norm and RoPE rows (ops/rmsnorm.h, ops/rope.h) as explicit vector code per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/norm_rope.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>

#include "hwy/highway.h"
#include "ops/cpu/simd/simd.h"
#include "ops/cpu/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {

// The sum of squares in double (as layer norm's statistics: a long row summed in float loses digits), then
// y = (x * rstd) * w, two roundings in f32, the products transformers' LlamaRMSNorm takes in f32.
float RMSNormForwardRow(const float* x, const float* w, float* y, double eps, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // floats widened one double vector at a time
  const size_t N = hn::Lanes(dd), whole = n / N * N, whole4 = n / (4 * N) * (4 * N);
  const auto widen = [&](size_t i) { return hn::PromoteTo(dd, hn::LoadU(df, x + i)); };
  hn::Vec<decltype(dd)> ss[4] = {hn::Zero(dd), hn::Zero(dd), hn::Zero(dd), hn::Zero(dd)};
  const auto square = [&](size_t i, size_t k) {
    const auto v = widen(i);
    ss[k] = hn::MulAdd(v, v, ss[k]);
  };
  for (size_t i = 0; i < whole4; i += 4 * N)
    for (size_t k = 0; k < 4; ++k) square(i + k * N, k);
  for (size_t i = whole4; i < whole; i += N) square(i, 0);
  double sq = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(ss[0], ss[1]), hn::Add(ss[2], ss[3]))));
  for (size_t i = whole; i < n; ++i) sq += double(x[i]) * double(x[i]);
  const float rs = float(1.0 / std::sqrt(sq / double(n) + eps));
  const auto vrs = hn::Set(d, rs);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    auto r = hn::Mul(LoadPart<Part>(d, x + i, count), vrs);
    if (w) r = hn::Mul(r, LoadPart<Part>(d, w + i, count));
    StorePart<Part>(r, d, y + i, count);
  });
  return rs;
}

// dx = rstd (g - xhat mean(g xhat)) with g = dy w, xhat = x rstd; dw += dy xhat_dw (xhat itself when null).
// Padding lanes hold x = dy = 0, so they add nothing to the sum.
void RMSNormBackwardRow(const float* dy, const float* x, const float* w, float rstd, float* dx, float* dw,
                        const float* xhat_dw, size_t n) {
  const hn::ScalableTag<float> d;
  const auto vrs = hn::Set(d, rstd);
  auto sum_gx = hn::Zero(d);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto vdy = LoadPart<Part>(d, dy + i, count);
    const auto xhat = hn::Mul(LoadPart<Part>(d, x + i, count), vrs);
    sum_gx = hn::MulAdd(hn::Mul(vdy, LoadPart<Part>(d, w + i, count)), xhat, sum_gx);
    const auto xw = xhat_dw ? LoadPart<Part>(d, xhat_dw + i, count) : xhat;
    StorePart<Part>(hn::MulAdd(vdy, xw, LoadPart<Part>(d, dw + i, count)), d, dw + i, count);
  });
  const auto vmean_gx = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, sum_gx)) / float(n));
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto xhat = hn::Mul(LoadPart<Part>(d, x + i, count), vrs);
    const auto g = hn::Mul(LoadPart<Part>(d, dy + i, count), LoadPart<Part>(d, w + i, count));
    StorePart<Part>(hn::Mul(vrs, hn::Sub(g, hn::Mul(xhat, vmean_gx))), d, dx + i, count);
  });
}

// `heads` heads of 2 half floats at one position: y0 = x0 c - x1 s, y1 = x1 c + x0 s, each product rounded
// (ops/kernels/rope.h's order); inverse negates s.
void RopeRows(const float* x, const float* cos, const float* sin, float* y, size_t heads, size_t half, bool inverse) {
  const hn::ScalableTag<float> d;
  for (size_t h = 0; h < heads; ++h) {
    const float* x0 = x + h * 2 * half;
    const float* x1 = x0 + half;
    float* y0 = y + h * 2 * half;
    float* y1 = y0 + half;
    ForEachVector(d, half, [&](size_t i, size_t count, auto part) {
      using Part = decltype(part);
      const auto a = LoadPart<Part>(d, x0 + i, count), b = LoadPart<Part>(d, x1 + i, count);
      const auto c = LoadPart<Part>(d, cos + i, count);
      auto s = LoadPart<Part>(d, sin + i, count);
      if (inverse) s = hn::Neg(s);
      StorePart<Part>(hn::Sub(hn::Mul(a, c), hn::Mul(b, s)), d, y0 + i, count);
      StorePart<Part>(hn::Add(hn::Mul(b, c), hn::Mul(a, s)), d, y1 + i, count);
    });
  }
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"

namespace minidl::ops::simd {

HWY_EXPORT(RMSNormForwardRow);
HWY_EXPORT(RMSNormBackwardRow);
HWY_EXPORT(RopeRows);

float rmsnorm_forward_row(const float* x, const float* w, float* y, double eps, int64_t n) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(RMSNormForwardRow)(x, w, y, eps, size_t(n));
}
void rmsnorm_backward_row(const float* dy, const float* x, const float* w, float rstd, float* dx, float* dw, int64_t n,
                          const float* xhat_dw) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(RMSNormBackwardRow)(dy, x, w, rstd, dx, dw, xhat_dw, size_t(n));
}
void rope_rows(const float* x, const float* cos, const float* sin, float* y, int64_t heads, int64_t half,
               bool inverse) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(RopeRows)(x, cos, sin, y, size_t(heads), size_t(half), inverse);
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
