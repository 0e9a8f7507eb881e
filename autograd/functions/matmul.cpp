// Differentiable matrix products (declared in autograd/functions.h).
//
// For C = op(A) op(B) with upstream gradient G = dC:
//   dA = G op(B)^T        (A transposed: dA = op(B) G^T)
//   dB = op(A)^T G        (B transposed: dB = G^T op(A))
// Every transpose here is a BLAS flag, never a copy. A 2-D operand shared across a batch gets the sum over the
// batch: for a row-major batched A that is one GEMM over all rows (the batch folded into M), otherwise a batched
// product summed with sum_to_shape.
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace minidl {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
bool needs_grad(const Tensor& t) { return autograd::any_requires_grad({t}); }

// t: (..., C) -> (rows, C); a view when t's layout allows.
Tensor rows_of(const Tensor& t) { return t.reshape(Shape{t.numel() / std::max<int64_t>(t.size(-1), 1), t.size(-1)}); }
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  Tensor a = autograd::autocast_to_half(a_in), b = autograd::autocast_to_half(b_in);
  Tensor out = ops::matmul(a, b, trans_a, trans_b);
  bool need_a = needs_grad(a), need_b = needs_grad(b);
  Tensor ad = a.detach(), bd = b.detach();
  return record("matmul", {a, b}, out, [=](const Tensor& g) {
    Tensor ga, gb;
    if (need_a) {
      Tensor full = trans_a ? ops::matmul(bd, g, trans_b, true) : ops::matmul(g, bd, false, !trans_b);
      ga = ops::sum_to_shape(full, ad.shape());
    }
    if (need_b) {
      if (bd.dim() == 2 && ad.dim() > 2 && !trans_a) {  // fold the batch into the reduction: one GEMM
        Tensor a2 = rows_of(ad), g2 = rows_of(g);
        gb = trans_b ? ops::matmul(g2, a2, true, false) : ops::matmul(a2, g2, true, false);
      } else {
        Tensor full = trans_b ? ops::matmul(g, ad, true, trans_a) : ops::matmul(ad, g, !trans_a, false);
        gb = ops::sum_to_shape(full, bd.shape());
      }
    }
    return Grads{ga, gb};
  });
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  Tensor x = autograd::autocast_to_half(x_in), weight = autograd::autocast_to_half(weight_in),
         bias = autograd::autocast_to_half(bias_in);
  Tensor out = ops::linear(x, weight, bias);
  bool need_x = needs_grad(x), need_w = needs_grad(weight), need_b = needs_grad(bias);
  Tensor xd = x.detach(), wd = weight.detach();
  return record("linear", {x, weight, bias}, out, [=](const Tensor& g) {
    Tensor g2 = rows_of(g);  // (rows, out)
    Tensor gx = need_x ? ops::matmul(g2, wd, false, true).reshape(xd.shape()) : Tensor();  // G W^T
    Tensor gw = need_w ? ops::matmul(rows_of(xd), g2, true, false) : Tensor();           // X^T G
    Tensor gbias = need_b ? ops::sum(g2, 0) : Tensor();
    return Grads{gx, gw, gbias};
  });
}

}  // namespace minidl
