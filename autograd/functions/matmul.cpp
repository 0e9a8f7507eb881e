// Differentiable matrix products (declared in autograd/functions.h).
//
// For C = op(A) op(B) with upstream gradient G = dC:
//   dA = G op(B)^T        (A transposed: dA = op(B) G^T)
//   dB = op(A)^T G        (B transposed: dB = G^T op(A))
// Every transpose here is a BLAS flag, never a copy. A 2-D operand shared across a batch gets the sum over the
// batch: for a row-major batched A that is one GEMM over all rows (the batch folded into M), otherwise a batched
// product summed with sum_to_shape.
//
// Under autocast an f32 operand (a weight, the f32 master) is multiplied as its 16-bit copy, but its gradient comes
// straight from a GEMM that reads the 16-bit operands and writes f32 (ops::matmul_f32): accumulated in f32 and
// never rounded to 16 bits, instead of a 16-bit gradient cast up by the autocast cast's backward. linear's bias
// likewise: its f32 gradient is the f32 column sum of the output gradient, in the weight gradient's GEMM on CUDA
// (ops::linear_weight_bias_grad: cuBLASLt's BGRADA epilogue).
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/functions/product_operand.h"
#include "autograd/node.h"
#include "ops/elementwise.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace minidl {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
bool needs_grad(const Tensor& t) { return autograd::any_requires_grad({t}); }

// t: (..., C) -> (rows, C); a view when t's layout allows.
Tensor rows_of(const Tensor& t) { return t.reshape(Shape{t.numel() / std::max<int64_t>(t.size(-1), 1), t.size(-1)}); }

using autograd::detail::grad_product;
using autograd::detail::Operand;
using autograd::detail::operand;
using autograd::detail::weight_bias_grads;
using autograd::detail::weight_grad;
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  const Operand a = operand(a_in), b = operand(b_in);
  Tensor out = ops::matmul(a.used, b.used, trans_a, trans_b);
  bool need_a = needs_grad(a.edge), need_b = needs_grad(b.edge), fa = a.f32_grad, fb = b.f32_grad;
  Tensor ad = a.used.detach(), bd = b.used.detach();
  return record("matmul", {a.edge, b.edge}, out, [=](const Tensor& g) {
    Tensor ga, gb;
    if (need_a) {
      Tensor full = trans_a ? grad_product(fa, bd, g, trans_b, true) : grad_product(fa, g, bd, false, !trans_b);
      ga = ops::sum_to_shape(full, ad.shape());
    }
    if (need_b) {
      if (bd.dim() == 2 && ad.dim() > 2 && !trans_a) {  // fold the batch into the reduction: one GEMM
        Tensor a2 = rows_of(ad), g2 = rows_of(g);
        // A weight (the CPU MLP's c_fc) straight into its grad() where the pass allows, as linear's.
        const Tensor &first = trans_b ? g2 : a2, &second = trans_b ? a2 : g2;
        gb = weight_grad(b, first, second, true, false);
      } else {
        Tensor full = trans_b ? grad_product(fb, g, ad, true, trans_a) : grad_product(fb, ad, g, !trans_a, false);
        gb = ops::sum_to_shape(full, bd.shape());
      }
    }
    return Grads{ga, gb};
  });
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Operand x = operand(x_in), weight = operand(weight_in), bias = operand(bias_in);
  Tensor out = ops::linear(x.used, weight.used, bias.used);
  bool need_x = needs_grad(x.edge), need_w = needs_grad(weight.edge), need_b = needs_grad(bias.edge);
  bool fx = x.f32_grad, fb = bias.f32_grad;
  Tensor xd = x.used.detach(), wd = weight.used.detach();
  return record("linear", {x.edge, weight.edge, bias.edge}, out, [=](const Tensor& g) {
    Tensor g2 = rows_of(g);                                                                     // (rows, out)
    Tensor gx = need_x ? grad_product(fx, g2, wd, false, true).reshape(xd.shape()) : Tensor();  // G W^T
    ops::LinearGrad wb = weight_bias_grads(rows_of(xd), g2, weight, need_w, need_b, fb);        // X^T G, sum(G)
    return Grads{gx, wb.dw, wb.dbias};
  });
}

}  // namespace minidl
