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

// One block's sum as eight interleaved partial sums: element i of the block goes to sum i % 8, and the eight are
// added pairwise at the end. Eight independent chains of additions instead of one: a single chain waited on each
// add's latency (4 cycles), 0.7 ms of the baby config's 53 ms step on one Zen 4 core. The order is fixed, so the
// result still does not depend on the thread count or the CPU (a float times a float is exact in double, so even a
// fused multiply-add gives the same sums).
template <class T>
static double sum_of_squares(const T* x, int64_t n, int64_t block) {
  double s[8] = {};
  int64_t i = block * kNormBlock;
  const int64_t e = std::min(n, i + kNormBlock);
  for (; i + 8 <= e; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += double(x[i + j]) * double(x[i + j]);
  for (int j = 0; i < e; ++i, ++j) s[j] += double(x[i]) * double(x[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// The sum of squares of all the tensors' elements: fixed blocks of kNormBlock per tensor, summed in order per
// tensor and then over tensors, so the result does not depend on the thread count. One parallel pass over the
// blocks of every tensor.
static double sum_of_squares(const std::vector<Tensor>& xs) {
  std::vector<int64_t> blocks;
  std::vector<size_t> first(1, 0);  // each tensor's first block in `partial`
  for (const Tensor& x : xs) {
    dispatch_float("grad_norm_squared", x.dtype(), [](auto) {});  // an unsupported dtype throws here, not in a thread
    blocks.push_back((x.numel() + kNormBlock - 1) / kNormBlock);
    first.push_back(first.back() + size_t(blocks.back()));
  }
  std::vector<double> partial(first.back(), 0.0);
  parallel_for_parts(blocks, 1, [&](size_t t, int64_t b0, int64_t b1) {
    dispatch_float("grad_norm_squared", xs[t].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = xs[t].data<T>();
      for (int64_t b = b0; b < b1; ++b) partial[first[t] + size_t(b)] = sum_of_squares(x, xs[t].numel(), b);
    });
  });
  double total = 0.0;
  for (size_t t = 0; t < xs.size(); ++t) {
    double tensor_total = 0.0;
    for (size_t b = first[t]; b < first[t + 1]; ++b) tensor_total += partial[b];
    total += tensor_total;
  }
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
  Tensor on_device;  // the device gradients' sum of squares, kept there and read back once
  std::vector<Tensor> host;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = checked_grad(params[i], i);
    if (!g.defined()) continue;
    if (!g.device().is_cpu()) {
      Tensor s = ops::sum(ops::square(g));
      on_device = on_device.defined() ? ops::add(on_device, s) : s;
      continue;
    }
    host.push_back(g);
  }
  const double total = sum_of_squares(host);
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
