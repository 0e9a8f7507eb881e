// Dropout's Philox draws as vector code: one 64-bit lane per draw, so one vector runs Lanes(u64) draws of
// ops/kernels/dropout.h's mapping at once (2 on SSE4, 4 on AVX2, 8 on AVX-512), bit for bit the scalar ones.
//
// Philox 4x32-10 (core/rng.h) multiplies 32-bit words into 64-bit products; MulEven of u32 lanes is exactly that
// for the low half of each 64-bit lane, where each word lives zero-extended. Element 4g + j takes word j of draw
// g; the four words come out as four vectors over draws, so their keep flags (compared in the vectors) are
// transposed to element order through a small stack buffer before the elements are selected.
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
                  uint64_t offset, float p, float scale) {
  uint64_t g = g0;
#if HWY_TARGET != HWY_SCALAR  // one lane cannot hold two 32-bit words: the scalar loop below does it all
  const hn::ScalableTag<uint64_t> d64;
  const hn::Repartition<uint32_t, decltype(d64)> d32;
  const hn::Repartition<float, decltype(d64)> df;  // 2 floats per draw lane: 4 elements per draw = 2 vectors
  const size_t N = hn::Lanes(d64);
  // keep iff float(word >> 8) * 2^-24 >= p (both exact), i.e. word >> 8 >= ceil(p * 2^24).
  const int64_t threshold = int64_t(std::ceil(double(p) * 16777216.0));
  const auto low32 = hn::Set(d64, 0xFFFFFFFFull), m0 = hn::Set(d64, 0xD2511F53ull), m1 = hn::Set(d64, 0xCD9E8D57ull);
  uint32_t k0[10], k1[10];  // the key schedule: k += (W0, W1) per round
  for (int r = 0; r < 10; ++r) {
    k0[r] = uint32_t(seed) + uint32_t(r) * 0x9E3779B9u;
    k1[r] = uint32_t(seed >> 32) + uint32_t(r) * 0xBB67AE85u;
  }
  const auto s0 = hn::Set(d64, uint64_t(uint32_t(stream))), s1 = hn::Set(d64, stream >> 32);
  const auto scale_v = hn::Set(df, scale);
  const hn::RebindToSigned<decltype(d64)> di64;
  const auto below = hn::Set(di64, threshold - 1);
  alignas(kMaxVectorBytes) uint64_t flags[2 * kMaxVectorBytes / sizeof(uint64_t)];  // 4 x u32 per draw
  alignas(kMaxVectorBytes) uint64_t words[2][kMaxVectorBytes / sizeof(uint64_t)];
  // Whole vectors of draws whose four elements all exist; the rest (at most one vector, and a ragged end) below.
  for (; g + N <= g1 && int64_t(4 * (g + N)) <= n; g += N) {
    const auto counter = hn::Add(hn::Set(d64, offset + g), hn::Iota(d64, 0));
    auto c0 = hn::And(counter, low32), c1 = hn::ShiftRight<32>(counter), c2 = s0, c3 = s1;
    for (int r = 0; r < 10; ++r) {
      const auto p0 = hn::MulEven(hn::BitCast(d32, c0), hn::BitCast(d32, m0));
      const auto p1 = hn::MulEven(hn::BitCast(d32, c2), hn::BitCast(d32, m1));
      const auto n0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(d64, uint64_t(k0[r])));
      const auto n2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(d64, uint64_t(k1[r])));
      c1 = hn::And(p1, low32);
      c3 = hn::And(p0, low32);
      c0 = n0;
      c2 = n2;
    }
    // Keep flags as all-ones / zero 64-bit lanes, words j and j + 1 of a draw packed into one lane (low half
    // first: the element order on this little-endian machine), then the two lanes of each draw interleaved.
    const auto keep = [&](auto c) {
      return hn::BitCast(d64, hn::VecFromMask(di64, hn::Gt(hn::BitCast(di64, hn::ShiftRight<8>(c)), below)));
    };
    const auto pack = [&](auto a, auto b) { return hn::Or(hn::And(keep(a), low32), hn::ShiftLeft<32>(keep(b))); };
    hn::Store(pack(c0, c1), d64, words[0]);
    hn::Store(pack(c2, c3), d64, words[1]);
    for (size_t lane = 0; lane < N; ++lane) {
      flags[2 * lane] = words[0][lane];
      flags[2 * lane + 1] = words[1][lane];
    }
    const hn::Repartition<uint32_t, decltype(df)> du;
    for (size_t half = 0; half < 2; ++half) {
      const size_t e = 4 * size_t(g) + half * hn::Lanes(df);
      const auto kept = hn::MaskFromVec(
          hn::BitCast(df, hn::Load(du, reinterpret_cast<const uint32_t*>(flags) + half * hn::Lanes(df))));
      hn::StoreU(hn::IfThenElseZero(kept, hn::Mul(hn::LoadU(df, x + e), scale_v)), df, y + e);
    }
  }
#endif
  const Philox rng(seed, stream);
  for (; g < g1; ++g) {
    bool keep[4];
    kernels::dropout_keep4(rng, offset, g, p, keep);
    for (int64_t i = int64_t(4 * g), e = std::min(n, i + 4); i < e; ++i)
      y[i] = keep[i - int64_t(4 * g)] ? x[i] * scale : 0.0f;
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
                   uint64_t stream, uint64_t offset, float p, float scale) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(DropoutDraws)(x, y, n, first_draw, end_draw, seed, stream, offset, p, scale);
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
