// RoPE's rotation of one pair (x[i], x[i + D/2]) of a head (ops/rope.h), shared by the CPU and CUDA kernels: two
// products and an add or subtract each, no fused multiply-add written (the CPU's vector code and the emulated CUDA
// kernel then round alike, bit for bit; nvcc may still contract on a GPU).
#pragma once

#include "core/host_device.h"

namespace minidl::ops::kernels {

// The forward rotation by a (c = cos a, s = sin a); the inverse (backward) is the same with -s.
template <class T>
MINIDL_HD void rope_rotate(T x0, T x1, T c, T s, T* y0, T* y1) {
  const T a = x0 * c, b = x1 * s, e = x1 * c, f = x0 * s;
  *y0 = a - b;
  *y1 = e + f;
}

}  // namespace minidl::ops::kernels
