// Differentiable reductions (declared in autograd/functions.h): the backward spreads the gradient of each
// reduced element back over the elements it came from.
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace minidl {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
// g: the gradient of a reduction over `dim` (with or without the kept dimension) -> x's shape, each value
// repeated along dim. Scaling the small reduced gradient first (mean) keeps the big tensor to one pass.
Tensor spread(const Tensor& g, const Shape& x_shape, int dim, double scale) {
  Tensor gs = scale == 1.0 ? g : ops::mul(g, scale);
  return ops::broadcast_to(gs.reshape(ops::reduced_shape(x_shape, dim, /*keepdim=*/true)), x_shape);
}
}  // namespace

// Under autocast, reductions run in f32 (autograd/autocast.h): 16-bit inputs are cast up first.
using autograd::autocast_to_f32;

Tensor sum(const Tensor& x_in) {
  Tensor x = autocast_to_f32(x_in);
  Shape xs = x.shape();
  return record("sum", {x}, ops::sum(x), [xs](const Tensor& g) { return Grads{ops::broadcast_to(g, xs)}; });
}

Tensor mean(const Tensor& x_in) {
  Tensor x = autocast_to_f32(x_in);
  Shape xs = x.shape();
  return record("mean", {x}, ops::mean(x),
                [xs](const Tensor& g) { return Grads{ops::broadcast_to(ops::mul(g, 1.0 / double(xs.numel())), xs)}; });
}

Tensor sum(const Tensor& x_in, int dim, bool keepdim) {
  Tensor x = autocast_to_f32(x_in);
  int d = x.wrap_dim(dim);
  Shape xs = x.shape();
  return record("sum_dim", {x}, ops::sum(x, d, keepdim),
                [xs, d](const Tensor& g) { return Grads{spread(g, xs, d, 1.0)}; });
}

Tensor mean(const Tensor& x_in, int dim, bool keepdim) {
  Tensor x = autocast_to_f32(x_in);
  int d = x.wrap_dim(dim);
  Shape xs = x.shape();
  return record("mean_dim", {x}, ops::mean(x, d, keepdim),
                [xs, d](const Tensor& g) { return Grads{spread(g, xs, d, 1.0 / double(xs[d]))}; });
}

Tensor max(const Tensor& x_in, int dim, bool keepdim) {
  Tensor x = autocast_to_f32(x_in);
  int d = x.wrap_dim(dim);
  ops::MaxResult r = ops::max(x, d, keepdim);
  Shape xs = x.shape();
  Tensor indices = r.indices;
  return record("max_dim", {x}, r.values, [xs, d, indices](const Tensor& g) {
    return Grads{ops::max_backward(g, indices, xs, d)};  // all of it to the first maximum
  });
}

}  // namespace minidl
