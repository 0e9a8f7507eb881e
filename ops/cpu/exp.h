// exp() that the compiler can vectorise, for the CPU kernels' hot loops (the attention tiles).
//
// glibc's expf is only vectorised under -ffast-math, which minidl does not use (its kernels rely on infinities
// and strict IEEE semantics). This is Cephes' expf: exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2 / 2,
// exp(r) by a degree-6 polynomial, about 1 ulp in [-87, 88]. Below -87.3 (where expf turns denormal) it returns
// 0, so masked scores (-inf) get exactly zero probability. Every step is an add, multiply, min/max, select or
// integer op, so GCC vectorises a loop of calls without -ffast-math (floor() and float-to-int casts would block
// it: they may trap). The double overload is std::exp: f64 is the gradient-check path, where
// exactness matters and speed does not.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace minidl::ops::cpu {

inline float exp_vectorizable(float x_in) {
  const float lo = -87.33654f, hi = 88.72283f;
  float x = std::min(std::max(x_in, lo), hi);
  // Adding 1.5 * 2^23 rounds x / ln 2 to the nearest integer n, which lands in the low mantissa bits of t.
  const float shifter = 12582912.0f;
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  int32_t n_int = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(shifter);
  // ln 2 split in two so that n * ln2_hi is exact and r keeps its low bits.
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float y = p * std::bit_cast<float>((n_int + 127) << 23);  // times 2^n
  return x_in < lo ? 0.0f : y;
}

inline double exp_vectorizable(double x) { return std::exp(x); }

}  // namespace minidl::ops::cpu
