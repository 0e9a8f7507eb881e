// GELU (tanh approximation) and bias + GELU, forward and backward, as explicit vector code per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/activation.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "ops/cpu/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {

void GeluRow(const float* x, const float* bias, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    auto v = LoadPart<Part>(d, x + i, count);
    if (bias) v = hn::Add(v, LoadPart<Part>(d, bias + i, count));
    StorePart<Part>(hn::Mul(v, GeluGate(d, v)), d, y + i, count);
  });
}

// gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2), s = sigmoid(2u): ops/kernels/gelu.h.
void GeluBackwardRow(const float* dy, const float* x, const float* bias, float* dx, float* dbias, size_t n) {
  const hn::ScalableTag<float> d;
  const auto one = hn::Set(d, 1.0f), two_k0 = hn::Set(d, 2.0f * 0.7978845608028654f);
  const auto three_k1 = hn::Set(d, 3.0f * 0.044715f);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    auto v = LoadPart<Part>(d, x + i, count);
    if (bias) v = hn::Add(v, LoadPart<Part>(d, bias + i, count));
    const auto s = GeluGate(d, v);
    const auto slope = hn::MulAdd(hn::Mul(three_k1, v), v, one);
    const auto grad = hn::MulAdd(hn::Mul(hn::Mul(hn::Mul(two_k0, v), s), hn::Sub(one, s)), slope, s);
    const auto g = hn::Mul(LoadPart<Part>(d, dy + i, count), grad);
    StorePart<Part>(g, d, dx + i, count);
    if (dbias) StorePart<Part>(hn::Add(LoadPart<Part>(d, dbias + i, count), g), d, dbias + i, count);
  });
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops::simd {

HWY_EXPORT(GeluRow);
HWY_EXPORT(GeluBackwardRow);

void gelu_row(const float* x, const float* bias, float* y, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(GeluRow)(x, bias, y, size_t(n));
}

void gelu_backward_row(const float* dy, const float* x, const float* bias, float* dx, float* dbias, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(GeluBackwardRow)(dy, x, bias, dx, dbias, size_t(n));
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
