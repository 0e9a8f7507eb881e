// The GPT MLP's two linear layers around a GELU as one differentiable op (declared in autograd/functions.h), so
// that each direction can put the GELU in a GEMM's epilogue (ops/linear_gelu.h):
//   forward:  aux = x W_fc + b_fc, h = gelu(aux)   one GEMM (GELU_AUX_BIAS), then y = h W_proj + b_proj
//   backward: dW_proj = h^T dy, db_proj = sum(dy)                 one GEMM (BGRADA)
//             dpre = (dy W_proj^T) * gelu'(aux), db_fc = sum(dpre)   one GEMM (DGELU_BGRAD)
//             dx = dpre W_fc^T, dW_fc = x^T dpre
// The same products as linear -> bias_gelu -> linear, so the same saved tensors (x, aux, h) and, under autocast,
// the same f32 weight gradients straight from the GEMM (ops::matmul_f32; see autograd/functions/matmul.cpp), and
// c_proj's f32 bias gradient as linear's. c_fc's bias gradient comes from DGELU_BGRAD, in the product's dtype.
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/functions/product_operand.h"
#include "autograd/node.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"

namespace minidl {

using Grads = std::vector<Tensor>;

namespace {
bool needs_grad(const Tensor& t) { return autograd::any_requires_grad({t}); }

// t: (..., C) -> (rows, C), contiguous.
Tensor rows_of(const Tensor& t) {
  return t.contiguous().reshape(Shape{t.numel() / std::max<int64_t>(t.size(-1), 1), t.size(-1)});
}

Tensor contiguous(const Tensor& t) { return t.defined() ? t.detach().contiguous() : t; }

using autograd::detail::grad_product;
using autograd::detail::Operand;
using autograd::detail::operand;
using autograd::detail::weight_bias_grads;
using autograd::detail::weight_grad;
}  // namespace

Tensor gelu_mlp(const Tensor& x_in, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias) {
  const Operand x = operand(x_in), fc_w = operand(fc_weight), proj_w = operand(proj_weight),
                proj_b = operand(proj_bias);
  Tensor fc_b = autograd::autocast_to_half(fc_bias);
  Tensor xd = contiguous(x.used), fwd = contiguous(fc_w.used), pwd = contiguous(proj_w.used);
  ops::LinearGelu f = ops::linear_gelu_forward(xd, fwd, contiguous(fc_b));
  Tensor out = ops::linear(f.h, pwd, contiguous(proj_b.used));
  const bool need_x = needs_grad(x.edge), need_fw = needs_grad(fc_w.edge), need_fb = needs_grad(fc_b),
             need_pw = needs_grad(proj_w.edge), need_pb = needs_grad(proj_b.edge);
  const bool fx = x.f32_grad, fpb = proj_b.f32_grad;
  Tensor h = f.h.detach(), aux = f.aux.detach();
  return autograd::record("gelu_mlp", {x.edge, fc_w.edge, fc_b, proj_w.edge, proj_b.edge}, out, [=](const Tensor& g) {
    Tensor g2 = rows_of(g);                                                                   // (rows, C)
    ops::LinearGrad proj = weight_bias_grads(rows_of(h), g2, proj_w, need_pw, need_pb, fpb);  // h^T G, sum(G)
    Tensor gx, gfw, gfb;
    if (need_x || need_fw || need_fb) {
      ops::DgeluBgrad d = ops::dgelu_bgrad(g2, pwd, rows_of(aux), need_fb);
      if (need_x) gx = grad_product(fx, d.dpre, fwd, false, true).reshape(xd.shape());  // dpre W_fc^T
      // x^T dpre, straight into fc_w's grad() where the pass allows
      if (need_fw) gfw = weight_grad(fc_w, rows_of(xd), d.dpre, true, false);
      gfb = d.dbias;
    }
    return Grads{gx, gfw, gfb, proj.dw, proj.dbias};
  });
}

}  // namespace minidl
