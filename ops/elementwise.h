// Elementwise kernels (no autograd): binary ops with NumPy broadcasting, in-place accumulation, unary math.
#pragma once

#include "core/tensor.h"

namespace minidl::ops {

// a + b with broadcasting; result is contiguous with the broadcast shape and a's dtype.
Tensor add(const Tensor& a, const Tensor& b);
// dst += src (same shape; dst contiguous). Used to accumulate gradients.
void add_(Tensor& dst, const Tensor& src);

}  // namespace minidl::ops
