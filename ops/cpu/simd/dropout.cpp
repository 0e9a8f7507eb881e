// Dropout's Philox draws as vector code: one 64-bit lane per draw, so one vector runs Lanes(u64) draws of
// ops/kernels/dropout.h's mapping at once (2 on SSE4, 4 on AVX2, 8 on AVX-512), bit for bit the scalar ones.
//
// Philox 4x32-10 (core/rng.h) multiplies 32-bit words into 64-bit products; MulEven of u32 lanes is exactly that
// for the low half of each 64-bit lane. Only the low 32 bits of a lane are ever read (MulEven, and the words at
// the end), so the rounds leave the high halves unmasked. Element 8g + 2j + h takes 16-bit half h of word j of
// draw g: the words go through a small stack buffer in element order (draw by draw), and each vector of
// elements widens its half as many words into (low half, high half) pairs of 32-bit lanes before comparing.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/dropout.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>

#include "hwy/highway.h"
#include "ops/cpu/simd/vec-inl.h"
#include "ops/kernels/dropout.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {

// y[i] = keep(i) ? x[i] * scale : 0 for the elements of draws [g0, g1), i < n.
void DropoutDraws(const float* x, float* y, int64_t n, uint64_t g0, uint64_t g1, uint64_t seed, uint64_t stream,
                  uint64_t offset, uint32_t threshold, float scale) {
  constexpr int64_t kPer = kernels::kDropoutPerDraw;
  uint64_t g = g0;
#if HWY_TARGET != HWY_SCALAR  // one lane cannot hold two 32-bit words: the scalar loop below does it all
  const hn::ScalableTag<uint64_t> d64;
  const hn::Repartition<uint32_t, decltype(d64)> d32;
  const hn::Repartition<float, decltype(d64)> df;            // the elements: 2 floats per draw lane...
  const hn::Repartition<uint32_t, decltype(df)> du;           // ...compared as 32-bit lanes
  const hn::Repartition<uint64_t, decltype(df)> dw;           // a vector of elements as 64-bit (lo, hi) pairs
  const hn::Rebind<uint32_t, decltype(dw)> dwords;            // the words those pairs come from
  const size_t N = hn::Lanes(d64), per_vector = hn::Lanes(df);  // kPer * N elements = 4 vectors of floats
  const auto m0 = hn::Set(d64, 0xD2511F53ull), m1 = hn::Set(d64, 0xCD9E8D57ull), low32 = hn::Set(d64, 0xFFFFFFFFull);
  uint32_t k0[10], k1[10];  // the key schedule: k += (W0, W1) per round
  for (int r = 0; r < 10; ++r) {
    k0[r] = uint32_t(seed) + uint32_t(r) * 0x9E3779B9u;
    k1[r] = uint32_t(seed >> 32) + uint32_t(r) * 0xBB67AE85u;
  }
  const auto s0 = hn::Set(d64, uint64_t(uint32_t(stream))), s1 = hn::Set(d64, stream >> 32);
  const auto scale_v = hn::Set(df, scale);
  const auto low16 = hn::Set(dw, 0xFFFFull);
  const hn::RebindToSigned<decltype(du)> di;
  const auto below = hn::Set(di, int32_t(threshold) - 1);  // bits >= threshold iff bits > threshold - 1
  alignas(kMaxVectorBytes) uint64_t words[kMaxVectorBytes / sizeof(uint64_t)][2];  // per draw: (w0|w1, w2|w3)
  alignas(kMaxVectorBytes) uint64_t pair[2][kMaxVectorBytes / sizeof(uint64_t)];
  // Whole vectors of draws whose eight elements all exist; the rest (at most one vector, and a ragged end) below.
  for (; g + N <= g1 && int64_t(kPer * (g + N)) <= n; g += N) {
    const auto counter = hn::Add(hn::Set(d64, offset + g), hn::Iota(d64, 0));
    auto c0 = counter, c1 = hn::ShiftRight<32>(counter), c2 = s0, c3 = s1;
    for (int r = 0; r < 10; ++r) {
      const auto p0 = hn::MulEven(hn::BitCast(d32, c0), hn::BitCast(d32, m0));
      const auto p1 = hn::MulEven(hn::BitCast(d32, c2), hn::BitCast(d32, m1));
      c0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(d64, uint64_t(k0[r])));
      c2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(d64, uint64_t(k1[r])));
      c1 = p1;  // its low 32 bits are the word
      c3 = p0;
    }
    // Words j and j + 1 of a draw packed into one 64-bit lane (low first: element order on this little-endian
    // machine), then stored draw by draw.
    hn::Store(hn::Or(hn::And(c0, low32), hn::ShiftLeft<32>(c1)), d64, pair[0]);
    hn::Store(hn::Or(hn::And(c2, low32), hn::ShiftLeft<32>(c3)), d64, pair[1]);
    for (size_t lane = 0; lane < N; ++lane) {
      words[lane][0] = pair[0][lane];
      words[lane][1] = pair[1][lane];
    }
    const uint32_t* w = reinterpret_cast<const uint32_t*>(words);
    for (size_t v = 0; v < size_t(kPer) * N / per_vector; ++v) {
      // per_vector / 2 words -> (low half, high half) of each in two 32-bit lanes.
      const auto wide = hn::PromoteTo(dw, hn::Load(dwords, w + v * per_vector / 2));
      const auto halves = hn::Or(hn::And(wide, low16), hn::ShiftLeft<32>(hn::ShiftRight<16>(wide)));
      const auto kept = hn::RebindMask(df, hn::Gt(hn::BitCast(di, halves), below));
      const size_t e = kPer * size_t(g) + v * per_vector;
      hn::StoreU(hn::IfThenElseZero(kept, hn::Mul(hn::LoadU(df, x + e), scale_v)), df, y + e);
    }
  }
#endif
  const Philox rng(seed, stream);
  for (; g < g1; ++g) {
    bool keep[kPer];
    kernels::dropout_keep8(rng, offset, g, threshold, keep);
    for (int64_t i = int64_t(kPer * g), e = std::min(n, i + kPer); i < e; ++i)
      y[i] = keep[i - int64_t(kPer * g)] ? x[i] * scale : 0.0f;
  }
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops::simd {

HWY_EXPORT(DropoutDraws);

void dropout_draws(const float* x, float* y, int64_t n, uint64_t first_draw, uint64_t end_draw, uint64_t seed,
                   uint64_t stream, uint64_t offset, uint32_t threshold, float scale) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(DropoutDraws)(x, y, n, first_draw, end_draw, seed, stream, offset, threshold, scale);
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
