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
  const hn::Repartition<float, decltype(d64)> df;               // the elements: 2 floats per draw lane...
  const hn::Repartition<uint32_t, decltype(df)> du;             // ...compared as 32-bit lanes
  const hn::Repartition<uint64_t, decltype(df)> dw;             // a vector of elements as 64-bit (lo, hi) pairs
  const hn::Rebind<uint32_t, decltype(dw)> dwords;              // the words those pairs come from
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
  // K vectors of draws per step, their rounds interleaved: one vector's ten rounds are a chain of 40 dependent
  // instructions (multiply, shift, two xors), and alone they left the core waiting on it. AMD EPYC family 25 model
  // 17, 1 thread, ns per element for 1, 2, 3, 4, 5 chains: AVX2 0.65, 0.53, 0.45, 0.39, 0.45; AVX-512 0.45, 0.34,
  // 0.30, 0.41, 0.38; SSE4 1.22, 0.99, 0.92, 0.89, 0.96. Then one vector at a time; what remains (ragged ends
  // included), one draw at a time below.
  const auto steps = [&](auto chains) {
    constexpr size_t K = decltype(chains)::value;
    for (; g + K * N <= g1 && int64_t(kPer * (g + K * N)) <= n; g += K * N) {
      hn::Vec<decltype(d64)> c0[K], c1[K], c2[K], c3[K];
      for (size_t k = 0; k < K; ++k) {
        const auto counter = hn::Add(hn::Set(d64, offset + g + k * N), hn::Iota(d64, 0));
        c0[k] = counter;
        c1[k] = hn::ShiftRight<32>(counter);
        c2[k] = s0;
        c3[k] = s1;
      }
      for (int r = 0; r < 10; ++r) {
        const auto key0 = hn::Set(d64, uint64_t(k0[r])), key1 = hn::Set(d64, uint64_t(k1[r]));
        for (size_t k = 0; k < K; ++k) {
          const auto p0 = hn::MulEven(hn::BitCast(d32, c0[k]), hn::BitCast(d32, m0));
          const auto p1 = hn::MulEven(hn::BitCast(d32, c2[k]), hn::BitCast(d32, m1));
          c0[k] = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1[k]), key0);
          c2[k] = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3[k]), key1);
          c1[k] = p1;  // its low 32 bits are the word
          c3[k] = p0;
        }
      }
      for (size_t k = 0; k < K; ++k) {
        // Words j and j + 1 of a draw packed into one 64-bit lane (low first: element order on this little-endian
        // machine), then stored draw by draw.
        hn::Store(hn::Or(hn::And(c0[k], low32), hn::ShiftLeft<32>(c1[k])), d64, pair[0]);
        hn::Store(hn::Or(hn::And(c2[k], low32), hn::ShiftLeft<32>(c3[k])), d64, pair[1]);
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
          const size_t e = kPer * size_t(g + k * N) + v * per_vector;
          hn::StoreU(hn::IfThenElseZero(kept, hn::Mul(hn::LoadU(df, x + e), scale_v)), df, y + e);
        }
      }
    }
  };
  steps(std::integral_constant<size_t, (HWY_TARGET <= HWY_AVX3 ? 3 : 4)>());
  steps(std::integral_constant<size_t, 1>());
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
