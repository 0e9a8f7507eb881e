// Flat-buffer kernels: AdamW, unscale-and-check, and the f32 <-> bf16/f16 casts. None of them reduces in float
// or fuses a multiply-add (ops/CMakeLists.txt builds ops/cpu/simd with -ffp-contract=off), so each gives the same
// bits as its scalar reference on every ISA.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/update.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "core/half.h"
#include "hwy/highway.h"
#include "ops/cpu/simd/vec-inl.h"
#include "ops/kernels/adamw.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {

// zero_g (null, or g itself): zeros stored there once g is read, the optimizer's zero_grad in the same pass.
void AdamW(float* p, const float* g, float* m, float* v, const minidl::kernels::AdamWConstants& c, size_t n,
           float* zero_g) {
  const hn::ScalableTag<float> d;
  const auto decay = hn::Set(d, c.decay), b1 = hn::Set(d, c.beta1), b2 = hn::Set(d, c.beta2);
  const auto omb1 = hn::Set(d, c.one_minus_beta1), omb2 = hn::Set(d, c.one_minus_beta2);
  const auto step = hn::Set(d, c.step_size), bc2 = hn::Set(d, c.bias_correction2_sqrt), eps = hn::Set(d, c.eps);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto vg = LoadPart<Part>(d, g + i, count);
    const auto vp = hn::Mul(LoadPart<Part>(d, p + i, count), decay);
    const auto vm = hn::Add(hn::Mul(b1, LoadPart<Part>(d, m + i, count)), hn::Mul(omb1, vg));
    const auto vv = hn::Add(hn::Mul(b2, LoadPart<Part>(d, v + i, count)), hn::Mul(hn::Mul(omb2, vg), vg));
    const auto denom = hn::Add(hn::Div(hn::Sqrt(vv), bc2), eps);
    StorePart<Part>(hn::Sub(vp, hn::Div(hn::Mul(step, vm), denom)), d, p + i, count);
    StorePart<Part>(vm, d, m + i, count);
    StorePart<Part>(vv, d, v + i, count);
    if (zero_g) StorePart<Part>(hn::Zero(d), d, zero_g + i, count);
  });
}

bool Unscale(float* g, float inv_scale, size_t n) {
  const hn::ScalableTag<float> d;
  const auto s = hn::Set(d, inv_scale);
  auto bad = hn::Zero(d);  // lanes that saw a non-finite result are all ones; the tail's padding is 0 * s
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto r = hn::Mul(LoadPart<Part>(d, g + i, count), s);
    StorePart<Part>(r, d, g + i, count);
    bad = hn::Or(bad, hn::VecFromMask(d, hn::Not(hn::IsFinite(r))));
  });
  return !hn::AllFalse(d, hn::MaskFromVec(bad));
}

// Round to nearest even on the bit pattern, NaN made quiet: core/half.h's to_bf16, one vector at a time.
void F32ToBF16(const float* s, bf16* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<uint16_t, decltype(d)> du16;
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto v = LoadPart<Part>(d, s + i, count);
    const auto u = hn::BitCast(du, v);
    const auto rounding = hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, rounding));
    const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
    const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    StorePart<Part>(hn::DemoteTo(du16, hn::BitCast(di, r)), du16, o + i, count);
  });
}

void BF16ToF32(const bf16* in, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<uint16_t, decltype(d)> du16;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(in);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du, LoadPart<Part>(du16, s + i, count)));
    StorePart<Part>(hn::BitCast(d, bits), d, out + i, count);
  });
}

// f16 through the F16C instructions (part of Highway's AVX2 and AVX-512 targets), which round to nearest even
// like core/half.h. Highway's SSE4 and portable conversions truncate, so those targets use core/half.h.
#if HWY_TARGET <= HWY_AVX2
void F32ToF16(const float* s, f16* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  hwy::float16_t* o = reinterpret_cast<hwy::float16_t*>(out);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    StorePart<Part>(hn::DemoteTo(dh, LoadPart<Part>(d, s + i, count)), dh, o + i, count);
  });
}

void F16ToF32(const f16* in, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const hwy::float16_t* s = reinterpret_cast<const hwy::float16_t*>(in);
  ForEachVector(d, n, [&](size_t i, size_t count, auto part) {
    using Part = decltype(part);
    StorePart<Part>(hn::PromoteTo(d, LoadPart<Part>(dh, s + i, count)), d, out + i, count);
  });
}
#else
void F32ToF16(const float* s, f16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_f16(s[i]);
}
void F16ToF32(const f16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}
#endif

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops::simd {

HWY_EXPORT(AdamW);
HWY_EXPORT(Unscale);
HWY_EXPORT(F32ToBF16);
HWY_EXPORT(BF16ToF32);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F16ToF32);

void adamw(float* p, const float* g, float* m, float* v, const minidl::kernels::AdamWConstants& c, int64_t n,
           float* zero_g) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(AdamW)(p, g, m, v, c, size_t(n), zero_g);
}
bool unscale(float* g, float inv_scale, int64_t n) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(Unscale)(g, inv_scale, size_t(n));
}
void f32_to_bf16(const float* s, bf16* d, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(F32ToBF16)(s, d, size_t(n));
}
void bf16_to_f32(const bf16* s, float* d, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(BF16ToF32)(s, d, size_t(n));
}
void f32_to_f16(const float* s, f16* d, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(F32ToF16)(s, d, size_t(n));
}
void f16_to_f32(const f16* s, float* d, int64_t n) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(F16ToF32)(s, d, size_t(n));
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
