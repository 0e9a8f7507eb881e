// Unscale-and-check on the CPU: parallel over fixed chunks, each ops/cpu/simd's vector loop that ORs the
// per-element overflow flags (the same test as ops/kernels/unscale.h's unscale_element).
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/simd/simd.h"
#include "ops/nn_checks.h"
#include "ops/unscale.h"

namespace minidl::ops {

static constexpr int64_t kUnscaleGrain = 1 << 15;

bool unscale_and_check_(const Tensor& grad, float inv_scale) {
  check_contiguous("unscale_and_check_", "grad", grad);
  MINIDL_CHECK(grad.dtype() == DType::f32, "unscale_and_check_: expected an f32 gradient, got ", grad.dtype());
  if (!grad.device().is_cpu()) return unscale_and_check_device(grad.device())(grad, inv_scale);
  float* g = grad.data<float>();
  const int64_t n = grad.numel();
  const int64_t chunks = (n + kUnscaleGrain - 1) / kUnscaleGrain;
  std::vector<char> overflow(size_t(chunks), 0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * kUnscaleGrain, e = std::min(n, b + kUnscaleGrain);
      overflow[size_t(c)] = char(simd::unscale(g + b, inv_scale, e - b));
    }
  });
  for (char o : overflow)
    if (o) return true;
  return false;
}

bool unscale_and_check_multi_(const std::vector<Tensor>& grads, float inv_scale) {
  if (grads.empty()) return false;
  const Device device = grads.front().device();
  for (const Tensor& g : grads) {
    check_contiguous("unscale_and_check_multi_", "grad", g);
    MINIDL_CHECK(g.dtype() == DType::f32, "unscale_and_check_multi_: expected f32 gradients, got ", g.dtype());
    MINIDL_CHECK(g.device() == device, "unscale_and_check_multi_: gradients on ", device, " and ", g.device());
  }
  if (!device.is_cpu()) return unscale_and_check_multi_device(device)(grads, inv_scale);
  bool overflow = false;
  for (const Tensor& g : grads) overflow |= unscale_and_check_(g, inv_scale);
  return overflow;
}

}  // namespace minidl::ops
