// Differentiable neural-network ops (declared in autograd/functions.h): each makes its inputs contiguous, runs
// the forward kernel from ops/ and records the backward right here.
//
// A backward never captures its own output tensor as is: the output holds the node, so that would be a
// reference cycle that leaks when backward never runs. It captures output.detach() (same storage, no history).
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/embedding.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/softmax.h"
#include "ops/swiglu.h"

namespace minidl {

using autograd::autocast_to_f32;
using autograd::autocast_to_half;
using autograd::record;
using Grads = std::vector<Tensor>;

// Undefined stays undefined, so the op's own check can name the missing argument.
static Tensor contiguous(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor w = contiguous(weight), i = contiguous(ids);
  Tensor y = ops::embedding_forward(w, i);
  int64_t V = w.size(0);
  y = record("embedding", {w, i}, y, [i, V](const Tensor& g) {
    return Grads{ops::embedding_backward(contiguous(g), i, V), Tensor()};
  });
  return autocast_to_half(y);  // gathered in f32 (and its gradient scattered in f32), then cast
}

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  Tensor xc = contiguous(x), w = contiguous(weight), b = contiguous(bias);
  // A 16-bit x (the residual stream under autocast) goes to the kernel as it is: normalised in f32 with the f32
  // weight and bias, y rounded once to x's dtype — what the next 16-bit matmul would have cast it to — and x saved
  // without an f32 copy (the residual stream feeds two layernorms per block).
  ops::LayerNormForward f = ops::layernorm_forward(xc, w, b, eps);
  return record("layernorm", {xc, w, b}, f.y, [xc, w, mean = f.mean, rstd = f.rstd](const Tensor& g) {
    const Tensor dy = contiguous(ops::cast(g, xc.dtype()));
    // On the CPU, the gradient x's other uses have sent already (a block's ln_1: the residual stream's, from the
    // add before ln_2) is added in the layer norm's own pass instead of by the engine in a pass of its own
    // (autograd::take_pending_gradient; the same bits). A device keeps the engine's add.
    const Tensor other = xc.device().is_cpu() ? autograd::take_pending_gradient(0) : Tensor();
    ops::LayerNormBackward r = other.defined() ? ops::add_layernorm_backward(dy, contiguous(other), xc, w, mean, rstd)
                                               : ops::layernorm_backward(dy, xc, w, mean, rstd);
    return Grads{r.dx, r.dweight, r.dbias};
  });
}

namespace {

// Two outputs (0: sum, 1: y), so that backward gets both gradients of the residual stream at once: the one from
// its later uses (dsum) and the layernorm's, added inside the backward kernel. a and b receive the same gradient.
class AddLayerNormNode final : public autograd::Node {
 public:
  AddLayerNormNode(const ops::AddLayerNormForward& f, const Tensor& weight)
      : Node("add_layernorm"), sum_(f.sum.detach()), weight_(weight), mean_(f.mean), rstd_(f.rstd) {}
  uint32_t num_outputs() const override { return 2; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor dsum = grads[0].defined() ? contiguous(ops::cast(grads[0], sum_.dtype())) : Tensor();
    if (!grads[1].defined()) return {dsum, dsum, Tensor(), Tensor()};
    const Tensor dy = contiguous(ops::cast(grads[1], sum_.dtype()));
    ops::LayerNormBackward r = ops::add_layernorm_backward(dy, dsum, sum_, weight_, mean_, rstd_);
    return {r.dx, r.dx, r.dweight, r.dbias};
  }

 private:
  Tensor sum_, weight_, mean_, rstd_;
};

}  // namespace

AddLayerNorm add_layernorm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps) {
  if (a.defined() && b.defined() && a.dtype() != b.dtype()) {  // mixed dtypes: the add promotes, as `a + b` does
    Tensor sum = a + b;
    return {sum, layernorm(sum, weight, bias, eps)};
  }
  Tensor ac = contiguous(a), bc = contiguous(b), w = contiguous(weight), bs = contiguous(bias);
  ops::AddLayerNormForward f = ops::add_layernorm_forward(ac, bc, w, bs, eps);
  AddLayerNorm out{f.sum, f.y};
  if (!autograd::any_requires_grad({ac, bc, w, bs})) return out;
  auto node = std::make_shared<AddLayerNormNode>(f, w);
  for (const Tensor& t : {ac, bc, w, bs}) node->next_edges().push_back(autograd::gradient_edge(t));
  out.sum.impl()->autograd.grad_fn = node;
  out.sum.impl()->autograd.output_nr = 0;
  out.y.impl()->autograd.grad_fn = node;
  out.y.impl()->autograd.output_nr = 1;
  return out;
}

Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps) {
  Tensor xc = contiguous(x), w = contiguous(weight);
  // A 16-bit x goes to the kernel as it is, as layernorm's: normalised in f32, y rounded to x's dtype.
  ops::RMSNormForward f = ops::rmsnorm_forward(xc, w, eps);
  return record("rmsnorm", {xc, w}, f.y, [xc, w, rstd = f.rstd](const Tensor& g) {
    ops::RMSNormBackward r = ops::rmsnorm_backward(contiguous(ops::cast(g, xc.dtype())), xc, w, rstd);
    return Grads{r.dx, r.dweight};
  });
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  Tensor xc = contiguous(x), c = contiguous(cos), s = contiguous(sin);
  // The tables are constants: no gradient flows to them.
  return record("rope", {xc}, ops::rope_forward(xc, c, s, position_offset),
                [c, s, position_offset, dtype = xc.dtype()](const Tensor& g) {
                  return Grads{ops::rope_backward(contiguous(ops::cast(g, dtype)), c, s, position_offset)};
                });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor gc = contiguous(gate), uc = contiguous(up);
  return record("swiglu", {gc, uc}, ops::swiglu_forward(gc, uc), [gc, uc](const Tensor& g) {
    ops::SwiGLUBackward r = ops::swiglu_backward(contiguous(ops::cast(g, gc.dtype())), gc, uc);
    return Grads{r.dgate, r.dup};
  });
}

Tensor gelu(const Tensor& x) {
  Tensor xc = contiguous(x);
  return record("gelu", {xc}, ops::gelu_forward(xc),
                [xc](const Tensor& g) { return Grads{ops::gelu_backward(contiguous(g), xc)}; });
}

Tensor bias_gelu(const Tensor& x, const Tensor& bias) {
  Tensor xc = contiguous(x);
  Tensor b = contiguous(autograd::autocast_enabled() && xc.defined() && ops::is_half(xc.dtype())
                            ? autograd::autocast_to(bias, xc.dtype())
                            : bias);
  return record("bias_gelu", {xc, b}, ops::bias_gelu_forward(xc, b), [xc, b](const Tensor& g) {
    ops::BiasGeluBackward r = ops::bias_gelu_backward(contiguous(g), xc, b);
    return Grads{r.dx, r.dbias};
  });
}

Tensor softmax(const Tensor& x) {
  Tensor xc = contiguous(autocast_to_f32(x));
  Tensor y = ops::softmax_forward(xc);
  return record("softmax", {xc}, y,
                [y = y.detach()](const Tensor& g) { return Grads{ops::softmax_backward(contiguous(g), y)}; });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, ops::Reduction reduction,
                     int64_t classes) {
  Tensor x = contiguous(logits), t = contiguous(targets);
  ops::CrossEntropyForward f = ops::cross_entropy_forward(x, t, ignore_index, reduction, classes);
  int64_t divisor = reduction == ops::Reduction::kSum ? 1 : f.count;
  // The logits are overwritten only if, when backward runs, this node's handle is the last one to them and to their
  // storage (no caller variable, view or other node can read them afterwards). The backward runs once (the graph is
  // not retained), so its own handle is not read again either.
  auto saved = std::make_shared<Tensor>(x.detach());
  auto backward = [saved, t, lse = f.lse, divisor, ignore_index, classes](const Tensor& g) {
    MINIDL_CHECK(saved->defined(),
                 "cross_entropy: a second backward through a node whose logits the first one "
                 "overwrote with their gradient");
    const bool last = saved->impl_ptr().use_count() == 1 && saved->impl()->storage.use_count() == 1;
    Tensor dlogits = ops::cross_entropy_backward(g, *saved, t, lse, divisor, ignore_index, classes, last);
    if (last) *saved = Tensor();
    return Grads{dlogits, Tensor()};
  };
  return record("cross_entropy", {x, t}, f.loss, backward);
}

Tensor causal_attention(const Tensor& qkv, int n_head, int n_kv_head) {
  Tensor x = contiguous(autocast_to_half(qkv));
  ops::AttentionForward f = ops::causal_attention_forward(x, n_head, n_kv_head);
  return record("causal_attention", {x}, f.out,
                [x, out = f.out.detach(), lse = f.lse, n_head, n_kv_head](const Tensor& g) {
                  return Grads{ops::causal_attention_backward(contiguous(g), x, out, lse, n_head, n_kv_head)};
                });
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset) {
  return minidl::dropout(x, p, seed, stream, offset, ops::DropoutStep{});
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset,
               const ops::DropoutStep& step) {
  if (p == 0.0) return x;
  Tensor xc = contiguous(x);
  // y = x * mask / (1 - p) is linear in x: its backward is the same masking of the gradient.
  return record("dropout", {xc}, ops::dropout(xc, p, seed, stream, offset, step),
                [=](const Tensor& g) { return Grads{ops::dropout(contiguous(g), p, seed, stream, offset, step)}; });
}

}  // namespace minidl
