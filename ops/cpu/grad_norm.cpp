// grad_norm_squared_multi and clip_grads_multi_ on the CPU: plain loops, the reference of the CUDA kernels'
// arithmetic (f64 sum of f32 squares, clip factor in f64 rounded to f32).
#include "ops/grad_norm.h"

#include <cmath>

#include "ops/nn_checks.h"

namespace minidl::ops {

static void check_grads(const char* op, const std::vector<Tensor>& grads, Device device) {
  for (const Tensor& g : grads) {
    check_contiguous(op, "grad", g);
    MINIDL_CHECK(g.dtype() == DType::f32, op, ": expected f32 gradients, got ", g.dtype());
    MINIDL_CHECK(g.device() == device, op, ": expected gradients on ", device, ", got one on ", g.device());
  }
}

Tensor grad_norm_squared_multi(const std::vector<Tensor>& grads, Device device) {
  check_grads("grad_norm_squared_multi", grads, device);
  if (!device.is_cpu()) return grad_norm_squared_multi_device(device)(grads, device);
  double s = 0.0;
  for (const Tensor& g : grads) {
    const float* x = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) s += double(x[i]) * double(x[i]);
  }
  return Tensor::full({1}, double(float(s)), DType::f32);
}

void clip_grads_multi_(const std::vector<Tensor>& grads, const Tensor& norm_squared, double max_norm) {
  MINIDL_CHECK(norm_squared.defined() && norm_squared.numel() == 1 && norm_squared.dtype() == DType::f32,
               "clip_grads_multi_: expected norm_squared as one f32 value, got ",
               norm_squared.defined() ? norm_squared.shape() : Shape{}, " ",
               norm_squared.defined() ? norm_squared.dtype() : DType::f32);
  check_grads("clip_grads_multi_", grads, norm_squared.device());
  if (!norm_squared.device().is_cpu())
    return clip_grads_multi_device(norm_squared.device())(grads, norm_squared, max_norm);
  const double factor = max_norm / (std::sqrt(double(norm_squared.data<float>()[0])) + 1e-6);
  if (!(factor < 1.0)) return;
  const float f = float(factor);
  for (const Tensor& g : grads) {
    float* x = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) x[i] *= f;
  }
}

}  // namespace minidl::ops
