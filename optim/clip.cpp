#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/elementwise.h"
#include "ops/grad_norm.h"
#include "ops/reduce.h"

namespace minidl::optim {

// Partial sums are taken over fixed blocks of this many elements and added in block order, so the result is the
// same for any thread count (a per-thread partial would make the norm depend on --threads).
static constexpr int64_t kNormBlock = 1 << 14;

template <class T>
static double sum_of_squares(const T* x, int64_t n) {
  int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double s = 0.0;
      for (int64_t i = b * kNormBlock, e = std::min(n, i + kNormBlock); i < e; ++i) s += double(x[i]) * double(x[i]);
      partial[size_t(b)] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

static Tensor checked_grad(const Tensor& p, size_t index) {
  Tensor g = p.grad();
  if (g.defined())
    MINIDL_CHECK(g.is_contiguous(), "clip_grad_norm: expected a contiguous gradient for parameter ", index,
                 ", got shape ", g.shape(), " strides ", g.strides());
  return g;
}

double grad_norm_squared(const std::vector<Tensor>& params) {
  double total = 0.0;
  Tensor on_device;  // the device gradients' sum of squares, kept there and read back once
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = checked_grad(params[i], i);
    if (!g.defined()) continue;
    if (!g.device().is_cpu()) {
      Tensor s = ops::sum(ops::square(g));
      on_device = on_device.defined() ? ops::add(on_device, s) : s;
      continue;
    }
    total += dispatch_float("grad_norm_squared", g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return sum_of_squares(g.data<T>(), g.numel());
    });
  }
  return on_device.defined() ? total + on_device.item() : total;
}

void scale_grads(const std::vector<Tensor>& params, double factor) {
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = checked_grad(params[i], i);
    if (!g.defined()) continue;
    if (!g.device().is_cpu()) {
      g.copy_(ops::mul(g, factor));
      continue;
    }
    dispatch_float("scale_grads", g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* x = g.data<T>();
      const T f = T(factor);
      parallel_for(0, g.numel(), kNormBlock, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) x[j] *= f;
      });
    });
  }
}

static std::vector<Tensor> defined_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = checked_grad(params[i], i);
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}

Tensor grad_norm_squared_tensor(const std::vector<Tensor>& params, Device device) {
  return ops::grad_norm_squared_multi(defined_grads(params), device);
}

void clip_grads_by(const std::vector<Tensor>& params, const Tensor& norm_squared, double max_norm) {
  MINIDL_CHECK(max_norm > 0.0, "clip_grads_by: expected max_norm > 0, got ", max_norm);
  ops::clip_grads_multi_(defined_grads(params), norm_squared, max_norm);
}

double clip_factor(double norm, double max_norm) { return max_norm / (norm + 1e-6); }

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  MINIDL_CHECK(max_norm > 0.0, "clip_grad_norm: expected max_norm > 0, got ", max_norm);
  double norm = std::sqrt(grad_norm_squared(params));
  if (std::isfinite(norm) && norm > max_norm) scale_grads(params, clip_factor(norm, max_norm));
  return norm;
}

}  // namespace minidl::optim
