// The per-element step of loss-scale unscaling, shared by the CPU loop (ops/cpu/unscale.cpp) and the CUDA kernel:
// multiply the gradient by 1/scale and report whether the result is not finite.
//
// The check is on the unscaled value: an inf or NaN gradient stays inf or NaN after the multiply, and a finite
// one can only overflow there if 1/scale > 1 (a scale below 1), which must count as an overflow too.
// |g| <= FLT_MAX is false for inf and for NaN (every comparison with NaN is false): one compare, vectorisable.
#pragma once

#include <cfloat>
#include <cmath>

#include "core/host_device.h"

namespace minidl::ops::kernels {

// g *= inv_scale; returns true if the result is inf or NaN.
MINIDL_HD bool unscale_element(float& g, float inv_scale) {
  g *= inv_scale;
  return !(std::fabs(g) <= FLT_MAX);
}

}  // namespace minidl::ops::kernels
