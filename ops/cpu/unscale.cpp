// Unscale-and-check on the CPU: parallel over fixed chunks, each ops/cpu/simd's vector loop that ORs the
// per-element overflow flags (the same test as ops/kernels/unscale.h's unscale_element).
#include <algorithm>
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

static void check_flag_and_state(const char* op, const Tensor& state, const Tensor& found_inf) {
  MINIDL_CHECK(state.defined() && state.numel() == 4 && state.dtype() == DType::f64 && state.is_contiguous(), op,
               ": expected the scaler state as 4 contiguous f64 values");
  MINIDL_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::i32, op,
               ": expected found_inf as one i32 flag");
  MINIDL_CHECK(state.device() == found_inf.device(), op, ": state is on ", state.device(), ", found_inf on ",
               found_inf.device());
}

void unscale_and_check_by_(const std::vector<Tensor>& grads, const Tensor& state, const Tensor& found_inf) {
  check_flag_and_state("unscale_and_check_by_", state, found_inf);
  for (const Tensor& g : grads) {
    check_contiguous("unscale_and_check_by_", "grad", g);
    MINIDL_CHECK(g.dtype() == DType::f32, "unscale_and_check_by_: expected f32 gradients, got ", g.dtype());
    MINIDL_CHECK(g.device() == state.device(), "unscale_and_check_by_: state on ", state.device(), ", a gradient on ",
                 g.device());
  }
  if (!state.device().is_cpu()) return unscale_and_check_by_device(state.device())(grads, state, found_inf);
  if (unscale_and_check_multi_(grads, float(1.0 / state.data<double>()[0]))) found_inf.data<int32_t>()[0] = 1;
}

void update_loss_scale_(const Tensor& state, const Tensor& scale_f32, const Tensor& found_inf,
                        const LossScaleRules& r) {
  check_flag_and_state("update_loss_scale_", state, found_inf);
  MINIDL_CHECK(scale_f32.defined() && scale_f32.numel() == 1 && scale_f32.dtype() == DType::f32 &&
                   scale_f32.device() == state.device(),
               "update_loss_scale_: expected scale_f32 as one f32 value on ", state.device());
  if (!state.device().is_cpu()) return update_loss_scale_device(state.device())(state, scale_f32, found_inf, r);
  double* s = state.data<double>();  // scale, clean_steps, overflows_left, skipped_steps (GradScaler::update)
  if (found_inf.data<int32_t>()[0] != 0) {
    s[3] += 1;
    s[1] = 0;
    s[2] = std::max(0.0, s[2] - 1);
    if (s[2] == 0) s[0] = std::max(s[0] * r.backoff_factor, r.min_scale);
  } else if ((s[1] += 1) >= double(r.growth_interval)) {
    s[0] = std::min(s[0] * r.growth_factor, r.max_scale);
    s[1] = 0;
    s[2] = double(r.hysteresis);
  }
  scale_f32.data<float>()[0] = float(s[0]);
}

}  // namespace minidl::ops
