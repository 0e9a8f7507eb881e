// The dropout decision, shared bit-for-bit by the CPU and CUDA kernels of ops/dropout.h.
//
// Element i (row-major index into the contiguous tensor) of a dropout call with (seed, stream, offset, p) is
//
//   kept  iff  Philox(seed, stream).uniform(offset + i / 4, i % 4) >= float(p)
//
// i.e. one Philox 4x32-10 draw (counter = offset + i/4) decides four consecutive elements, lane i%4 each; the
// uniform is the top 24 bits of the lane's word times 2^-24 (core/rng.h) and is compared in float with p rounded
// to float. A kept element is multiplied by scale = T(1) / (T(1) - T(p)), computed in the tensor's dtype T; a
// dropped one becomes 0.
// Calls that must not share draws must use offsets at least ceil(numel / 4) apart.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/rng.h"

namespace minidl::ops::kernels {

// Keep flags of the four elements 4*group .. 4*group+3: one Philox draw.
MINIDL_HD void dropout_keep4(const Philox& rng, uint64_t offset, uint64_t group, float p, bool keep[4]) {
  uint4x r = rng.draw(offset + group);
  keep[0] = Philox::to_unit(r.x) >= p;
  keep[1] = Philox::to_unit(r.y) >= p;
  keep[2] = Philox::to_unit(r.z) >= p;
  keep[3] = Philox::to_unit(r.w) >= p;
}

}  // namespace minidl::ops::kernels
