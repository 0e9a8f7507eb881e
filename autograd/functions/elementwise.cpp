// Differentiable elementwise ops (declared in autograd/functions.h). Each forward calls its ops/ kernel and
// records the backward right here. Saved tensors are detached views: backward needs their values, not their
// history, and a node must never hold its own output's history (that would be a reference cycle).
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/elementwise.h"

namespace minidl {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
// Will t receive a gradient? Lets a backward skip the work for inputs that need none.
bool needs_grad(const Tensor& t) { return autograd::any_requires_grad({t}); }

// Under autocast, a 16-bit operand meeting an f32 one (or the other 16-bit type) is cast to f32 first: type
// promotion, as in PyTorch. Outside autocast, mixed dtypes stay an error of the op.
std::pair<Tensor, Tensor> promote(const Tensor& a, const Tensor& b) {
  if (!autograd::autocast_enabled() || !a.defined() || !b.defined() || a.dtype() == b.dtype()) return {a, b};
  return {autograd::autocast_to_f32(a), autograd::autocast_to_f32(b)};
}
}  // namespace

// ---- binary: the gradient of a broadcast input is summed back to its shape ----

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promote(a_in, b_in);
  Shape sa = a.shape(), sb = b.shape();
  return record("add", {a, b}, ops::add(a, b), [sa, sb](const Tensor& g) {
    return Grads{ops::sum_to_shape(g, sa), ops::sum_to_shape(g, sb)};
  });
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promote(a_in, b_in);
  Shape sa = a.shape(), sb = b.shape();
  bool need_b = needs_grad(b);
  return record("sub", {a, b}, ops::sub(a, b), [sa, sb, need_b](const Tensor& g) {
    return Grads{ops::sum_to_shape(g, sa), need_b ? ops::sum_to_shape(ops::neg(g), sb) : Tensor()};
  });
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promote(a_in, b_in);
  bool need_a = needs_grad(a), need_b = needs_grad(b);
  Tensor ad = a.detach(), bd = b.detach();
  return record("mul", {a, b}, ops::mul(a, b), [=](const Tensor& g) {  // d(ab) = b da + a db
    return Grads{need_a ? ops::sum_to_shape(ops::mul(g, bd), ad.shape()) : Tensor(),
                 need_b ? ops::sum_to_shape(ops::mul(g, ad), bd.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promote(a_in, b_in);
  Tensor out = ops::div(a, b);
  bool need_a = needs_grad(a), need_b = needs_grad(b);
  Tensor ad = a.detach(), bd = b.detach(), yd = out.detach();
  return record("div", {a, b}, out, [=](const Tensor& g) {  // y = a / b: dy/da = 1 / b, dy/db = -y / b
    Tensor g_over_b = ops::div(g, bd);
    return Grads{need_a ? ops::sum_to_shape(g_over_b, ad.shape()) : Tensor(),
                 need_b ? ops::sum_to_shape(ops::neg(ops::mul(g_over_b, yd)), bd.shape()) : Tensor()};
  });
}

// ---- with a scalar ----

Tensor add(const Tensor& a, double s) {
  return record("add_scalar", {a}, ops::add(a, s), [](const Tensor& g) { return Grads{g}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("mul_scalar", {a}, ops::mul(a, s), [s](const Tensor& g) { return Grads{ops::mul(g, s)}; });
}

// ---- unary ----

Tensor neg(const Tensor& a) {
  return record("neg", {a}, ops::neg(a), [](const Tensor& g) { return Grads{ops::neg(g)}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = ops::exp(a);
  Tensor yd = out.detach();
  return record("exp", {a}, out, [yd](const Tensor& g) { return Grads{ops::mul(g, yd)}; });  // d exp = exp
}

Tensor log(const Tensor& a) {
  Tensor ad = a.detach();
  return record("log", {a}, ops::log(a), [ad](const Tensor& g) { return Grads{ops::div(g, ad)}; });
}

Tensor tanh(const Tensor& a) {
  Tensor out = ops::tanh(a);
  Tensor yd = out.detach();
  return record("tanh", {a}, out, [yd](const Tensor& g) { return Grads{ops::tanh_backward(g, yd)}; });
}

Tensor sqrt(const Tensor& a) {
  Tensor out = ops::sqrt(a);
  Tensor yd = out.detach();
  return record("sqrt", {a}, out, [yd](const Tensor& g) {  // d sqrt(a) = 1 / (2 sqrt(a))
    return Grads{ops::div(ops::mul(g, 0.5), yd)};
  });
}

Tensor square(const Tensor& a) {
  Tensor ad = a.detach();
  return record("square", {a}, ops::square(a), [ad](const Tensor& g) { return Grads{ops::mul(g, ops::mul(ad, 2.0))}; });
}

}  // namespace minidl
