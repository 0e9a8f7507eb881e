// Philox 4x32-10: a counter-based random number generator (Salmon et al., SC'11).
//
// A draw is a pure function of (key, counter): there is no hidden state to carry between calls, which is what lets
// the CPU and the GPU (and any number of ranks) produce the same numbers. minidl addresses draws by
// (seed, stream, offset): the key is the seed, the counter holds the stream id and the offset.
//
//   Philox rng(seed);                       // or any stream id:  Philox rng(seed, stream)
//   uint4x r = rng.draw(offset);            // four independent 32-bit words
//   float u = rng.uniform(offset, 2);       // in [0, 1)
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace minidl {

struct uint4x {
  uint32_t x, y, z, w;
};

class Philox {
 public:
  MINIDL_HD Philox(uint64_t seed, uint64_t stream = 0)
      : k0_(uint32_t(seed)), k1_(uint32_t(seed >> 32)), s0_(uint32_t(stream)), s1_(uint32_t(stream >> 32)) {}

  // Four 32-bit words for counter `offset` of this (seed, stream).
  MINIDL_HD uint4x draw(uint64_t offset) const {
    uint32_t c0 = uint32_t(offset), c1 = uint32_t(offset >> 32), c2 = s0_, c3 = s1_;
    uint32_t k0 = k0_, k1 = k1_;
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
      uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
      c1 = uint32_t(p1);
      c3 = uint32_t(p0);
      c0 = n0;
      c2 = n2;
      k0 += kW0;
      k1 += kW1;
    }
    return {c0, c1, c2, c3};
  }

  // Uniform float in [0, 1) from word `lane` (0..3) of draw(offset): 24 random bits.
  MINIDL_HD float uniform(uint64_t offset, int lane = 0) const { return to_unit(word(draw(offset), lane)); }

  // Standard normal from draw(offset) (Box-Muller on words 0 and 1).
  MINIDL_HD float normal(uint64_t offset) const {
    uint4x r = draw(offset);
    float u1 = (float(r.x >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    float u2 = to_unit(r.y);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
  }

  MINIDL_HD static float to_unit(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }
  MINIDL_HD static uint32_t word(const uint4x& r, int lane) {
    return lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
  }

 private:
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0_, k1_, s0_, s1_;
};

}  // namespace minidl
