// 16-bit float storage types (IEEE f16 and bfloat16) with round-to-nearest-even conversions.
// Arithmetic always happens in f32: these are storage formats, converted on load and store.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace minidl {

struct f16 {
  uint16_t bits = 0;
};
struct bf16 {
  uint16_t bits = 0;
};

MINIDL_HD uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
MINIDL_HD float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

MINIDL_HD float to_float(bf16 h) { return bits_float(uint32_t(h.bits) << 16); }

MINIDL_HD bf16 to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                               // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

MINIDL_HD float to_float(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

MINIDL_HD f16 to_f16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};   // nan
  if (abs >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // overflow -> inf (>= 65520)
  if (abs < 0x38800000u) {                                       // subnormal or zero in f16
    float a = bits_float(abs);
    // round(a / 2^-24) with ties to even, done in float (exact for these magnitudes)
    float q = a * 16777216.0f;
    uint32_t m = uint32_t(q);
    float r = q - float(m);
    if (r > 0.5f || (r == 0.5f && (m & 1u))) ++m;
    return f16{uint16_t(sign | m)};
  }
  uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);
  return f16{uint16_t(sign | ((mant_round - 0x38000000u) >> 13))};
}

}  // namespace minidl
