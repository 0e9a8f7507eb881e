// How autograd's matrix products (autograd/functions/matmul.cpp, mlp.cpp) see an operand under autocast: the
// tensor the product reads and the tensor its gradient goes to, and the gradient product in f32 where the
// operand was cast down (ops::matmul_f32: the weight gradients of mixed precision come out of the GEMM in f32).
#pragma once

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/cast.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

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

// On the CPU, a weight gradient op(x)^T-style product for `w` (the operand's edge) added straight into w.grad() by
// the GEMM where the backward pass allows (autograd::accumulate_in_place): true, and the gradient to return for w
// is undefined. Not under autocast (an f32 gradient of 16-bit operands), nor on a device, where the GEMM writes a
// fresh gradient as before (on CUDA with the bias gradient in its epilogue).
inline bool weight_grad_in_place(const Operand& w, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  if (w.f32_grad || !a.device().is_cpu()) return false;
  return accumulate_in_place(w.edge, [&](Tensor& grad) { ops::matmul_add_(grad, a, b, ta, tb); });
}

// A weight's gradient op(a) op(b): straight into w.grad() where the pass allows (weight_grad_in_place), and then
// undefined; a fresh product otherwise (in f32 for an f32 gradient).
inline Tensor weight_grad(const Operand& w, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return weight_grad_in_place(w, a, b, ta, tb) ? Tensor() : grad_product(w.f32_grad, a, b, ta, tb);
}

// A linear layer's weight gradient X^T G and bias gradient sum(G) (X: (rows, in), G: (rows, out)), each only when
// asked for. When both are asked for in the same precision they come from one call (on CUDA one GEMM with the sum
// in its epilogue); the bias gradient is in f32 where the bias was cast down. The weight's gradient is undefined
// where it went straight into w.grad() (weight_grad_in_place).
inline ops::LinearGrad weight_bias_grads(const Tensor& x, const Tensor& g, const Operand& w, bool need_w, bool need_b,
                                         bool f32_b) {
  const bool f32_w = w.f32_grad;
  // On the CPU in f32 both from one call, the weight's summed into w.grad() and the bias's column sums in the same
  // parallel region (ops::linear_weight_bias_grad_into).
  if (need_w && need_b && !f32_w && !f32_b && x.device().is_cpu() && x.dtype() == DType::f32 &&
      g.dtype() == DType::f32) {
    Tensor db;
    if (accumulate_in_place(w.edge, [&](Tensor& grad) {
          db = Tensor::empty({g.size(-1)}, DType::f32, g.device());
          ops::linear_weight_bias_grad_into(grad, db, x, g, /*accumulate=*/true);
        }))
      return {Tensor(), db};
  }
  if (need_w && weight_grad_in_place(w, x, g, true, false)) need_w = false;
  if (need_w && need_b && f32_w == f32_b) return ops::linear_weight_bias_grad(x, g, f32_w);
  ops::LinearGrad out;
  if (need_w) out.dw = grad_product(f32_w, x, g, true, false);
  if (need_b) out.dbias = ops::sum(f32_b ? ops::upcast(g) : g, 0);
  return out;
}

}  // namespace minidl::autograd::detail
