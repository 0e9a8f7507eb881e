// The dropout decision, shared bit-for-bit by the CPU and CUDA kernels of ops/dropout.h.
//
// Element i (row-major index into the contiguous tensor) of a dropout call with (seed, stream, offset, p) is
//
//   kept  iff  half i % 2 of word (i / 2) % 4 of Philox(seed, stream).draw(offset + i / 8)  >=  ceil(p 2^16)
//
// i.e. one Philox 4x32-10 draw (counter = offset + i/8) decides eight consecutive elements, each from 16 bits
// (the low half of a word first): p is resolved to 1/65536 (the keep probability is off by less than 1.5e-5),
// and a draw serves twice the elements it would with 32-bit uniforms, which halves the Philox work, the cost of
// dropout on a CPU. A kept element is multiplied by scale = T(1) / (T(1) - T(p)), computed in the tensor's dtype
// T; a dropped one becomes 0.
// Calls that must not share draws must use offsets at least ceil(numel / 8) apart.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "core/rng.h"

namespace minidl::ops::kernels {

// Elements per Philox draw.
constexpr int kDropoutPerDraw = 8;

// The 16-bit threshold: keep iff bits >= threshold; p in [0, 1) gives 0..65536 (65536: nothing kept).
MINIDL_HD uint32_t dropout_threshold(float p) { return uint32_t(ceil(double(p) * 65536.0)); }

// Keep flags of the eight elements 8*group .. 8*group+7: one Philox draw.
MINIDL_HD void dropout_keep8(const Philox& rng, uint64_t offset, uint64_t group, uint32_t threshold, bool keep[8]) {
  uint4x r = rng.draw(offset + group);
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  for (int j = 0; j < 4; ++j) {
    keep[2 * j] = (w[j] & 0xFFFFu) >= threshold;
    keep[2 * j + 1] = (w[j] >> 16) >= threshold;
  }
}

}  // namespace minidl::ops::kernels
