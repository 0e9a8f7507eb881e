// Differentiable convolution and pooling on channels-last images (declared in autograd/functions.h; kernels and
// layouts in ops/conv.h).
#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/conv.h"

namespace minidl {

using autograd::record;
using Grads = std::vector<Tensor>;

static Tensor contiguous(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation) {
  Tensor xc = contiguous(x), w = contiguous(weight), b = contiguous(bias);
  ops::Conv2dOptions o{stride, padding, dilation};
  Tensor y = ops::conv2d_forward(xc, w, b, o);
  // The input's gradient is skipped when nothing upstream wants it (the images fed to the first layer).
  bool need_dx = xc.requires_grad() || xc.grad_fn() != nullptr;
  if (!b.defined())
    return record("conv2d", {xc, w}, y, [xc, w, o, need_dx](const Tensor& g) {
      ops::Conv2dBackward r = ops::conv2d_backward(contiguous(g), xc, w, o, need_dx);
      return Grads{r.dx, r.dweight};
    });
  return record("conv2d", {xc, w, b}, y, [xc, w, o, need_dx](const Tensor& g) {
    ops::Conv2dBackward r = ops::conv2d_backward(contiguous(g), xc, w, o, need_dx);
    return Grads{r.dx, r.dweight, r.dbias};
  });
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) {
  Tensor xc = contiguous(x);
  ops::Pool2dOptions o{kernel, stride};
  Tensor y = ops::max_pool2d_forward(xc, o);
  return record("max_pool2d", {xc}, y, [xc, y = y.detach(), o](const Tensor& g) {
    return Grads{ops::max_pool2d_backward(contiguous(g), xc, y, o)};
  });
}

}  // namespace minidl
