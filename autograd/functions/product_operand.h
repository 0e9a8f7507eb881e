// How autograd's matrix products (autograd/functions/matmul.cpp, mlp.cpp) see an operand under autocast: the
// tensor the product reads and the tensor its gradient goes to, and the gradient product in f32 where the
// operand was cast down (ops::matmul_f32: the weight gradients of mixed precision come out of the GEMM in f32).
#pragma once

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/matmul.h"

namespace minidl::autograd::detail {

// `used` (cast to 16 bits by autocast, or as given) and `edge`, the tensor its gradient goes to: the f32 original
// when autocast cast it down (with f32_grad set), `used` otherwise.
struct Operand {
  Tensor used, edge;
  bool f32_grad;
};

inline Operand operand(const Tensor& t) {
  Tensor used = autocast_to_half(t);
  const bool cast_down = t.defined() && t.dtype() == DType::f32 && used.dtype() != DType::f32;
  return {cast_down ? used.detach() : used, cast_down ? t : used, cast_down};
}

// The product of a gradient, in f32 for an operand that gets an f32 gradient.
inline Tensor grad_product(bool f32_grad, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return f32_grad ? ops::matmul_f32(a, b, ta, tb) : ops::matmul(a, b, ta, tb);
}

}  // namespace minidl::autograd::detail
