#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "ops/unscale.h"

namespace minidl::optim {

GradScaler::GradScaler(const GradScalerOptions& o) : options_(o) {
  MINIDL_CHECK(o.growth_factor > 1.0, "GradScaler: expected growth_factor > 1, got ", o.growth_factor);
  MINIDL_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "GradScaler: expected backoff_factor in (0, 1), got ",
               o.backoff_factor);
  MINIDL_CHECK(o.growth_interval >= 1, "GradScaler: expected growth_interval >= 1, got ", o.growth_interval);
  MINIDL_CHECK(o.hysteresis >= 1, "GradScaler: expected hysteresis >= 1, got ", o.hysteresis);
  MINIDL_CHECK(o.min_scale > 0.0 && o.min_scale <= o.max_scale && std::isfinite(o.max_scale),
               "GradScaler: expected 0 < min_scale <= max_scale < inf, got min_scale ", o.min_scale, " and max_scale ",
               o.max_scale);
  MINIDL_CHECK(o.init_scale >= o.min_scale && o.init_scale <= o.max_scale, "GradScaler: expected init_scale in [",
               o.min_scale, ", ", o.max_scale, "], got ", o.init_scale);
  state_ = {o.init_scale, 0, o.hysteresis, 0};
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!state_on_device()) return mul(loss, state_.scale);
  MINIDL_CHECK(loss.device() == device_scale_.device(), "GradScaler::scale: the state is on ", device_scale_.device(),
               ", the loss on ", loss.device());
  return mul(loss, device_scale_.reshape(loss.shape()));
}

void GradScaler::keep_state_on(Device device) {
  MINIDL_CHECK(device.is_cuda(), "GradScaler::keep_state_on: expected a CUDA device, got ", device);
  if (state_on_device()) {
    MINIDL_CHECK(device_state_.device() == device, "GradScaler::keep_state_on: the state is already on ",
                 device_state_.device(), ", asked for ", device);
    return;
  }
  const GradScalerState& s = state_;
  device_state_ = Tensor::from_vector(std::vector<double>{s.scale, double(s.clean_steps), double(s.overflows_left),
                                                          double(s.skipped_steps)},
                                      {4}, DType::f64)
                      .to(device);
  device_scale_ = Tensor::full({1}, s.scale, DType::f32, device);
}

GradScalerState GradScaler::state() const {
  if (!state_on_device()) return state_;
  const std::vector<double> d = device_state_.to_vector();
  return {d[0], int64_t(d[1]), int64_t(d[2]), int64_t(d[3])};
}

Tensor GradScaler::unscale_(const std::vector<Tensor>& params) {
  MINIDL_CHECK(state_on_device(), "GradScaler::unscale_: the state is on the host (keep_state_on(device) first)");
  MINIDL_CHECK(!unscaled_, "GradScaler::unscale_: already called for this step (call step() first)");
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  found_inf_ = Tensor::zeros({1}, DType::i32, device_state_.device());
  ops::unscale_and_check_by_(grads, device_state_, found_inf_);
  combine_overflow_on_device(found_inf_);
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::unscale_and_check(const std::vector<Tensor>& params) {
  if (state_on_device()) return unscale_(params).item() != 0;
  MINIDL_CHECK(!unscaled_, "GradScaler::unscale_and_check: already called for this step (call step() first)");
  const float inv_scale = float(1.0 / state_.scale);
  // Grouped by device (one list on a GPU: one flag read back per step, not one per gradient).
  std::vector<Tensor> cpu_grads, device_grads;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) (g.device().is_cpu() ? cpu_grads : device_grads).push_back(g);
  }
  bool local = ops::unscale_and_check_multi_(cpu_grads, inv_scale);
  local |= ops::unscale_and_check_multi_(device_grads, inv_scale);
  overflow_ = combine_overflow(local);
  unscaled_ = true;
  return overflow_;
}

ScalerStep GradScaler::step(Optimizer& optimizer) {
  if (!unscaled_) {
    std::vector<Tensor> params;
    for (const ParamGroup& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
    if (state_on_device())
      unscale_(params);
    else
      unscale_and_check(params);
  }
  ScalerStep result;
  if (state_on_device()) {
    optimizer.step_unless(found_inf_);
    const GradScalerOptions& o = options_;
    ops::update_loss_scale_(
        device_state_, device_scale_, found_inf_,
        {o.growth_factor, o.backoff_factor, o.min_scale, o.max_scale, o.growth_interval, o.hysteresis});
    unscaled_ = false;
    result.scale = result.next_scale = NAN;
    result.found_inf = found_inf_;
    return result;
  }
  result.scale = state_.scale;
  result.applied = !overflow_;
  if (overflow_)
    result.reason = "inf/nan in gradients";
  else
    optimizer.step();
  update(overflow_);
  unscaled_ = false;
  result.next_scale = state_.scale;
  return result;
}

void GradScaler::update(bool overflow) {
  GradScalerState& s = state_;
  if (overflow) {
    ++s.skipped_steps;
    s.clean_steps = 0;
    s.overflows_left = std::max<int64_t>(0, s.overflows_left - 1);
    if (s.overflows_left == 0) s.scale = std::max(s.scale * options_.backoff_factor, options_.min_scale);
    return;
  }
  if (++s.clean_steps >= options_.growth_interval) {
    s.scale = std::min(s.scale * options_.growth_factor, options_.max_scale);
    s.clean_steps = 0;
    s.overflows_left = options_.hysteresis;
  }
}

void GradScaler::load_state(const GradScalerState& s) {
  MINIDL_CHECK(s.scale >= options_.min_scale && s.scale <= options_.max_scale, "GradScaler::load_state: scale ",
               s.scale, " is outside [min_scale, max_scale] = [", options_.min_scale, ", ", options_.max_scale, "]");
  MINIDL_CHECK(s.clean_steps >= 0 && s.overflows_left >= 0 && s.skipped_steps >= 0,
               "GradScaler::load_state: expected counters >= 0, got clean_steps ", s.clean_steps, ", overflows_left ",
               s.overflows_left, ", skipped_steps ", s.skipped_steps);
  state_ = s;
  unscaled_ = false;
  if (state_on_device()) {
    device_state_.copy_(Tensor::from_vector(
        std::vector<double>{s.scale, double(s.clean_steps), double(s.overflows_left), double(s.skipped_steps)}, {4},
        DType::f64));
    device_scale_.fill_(s.scale);
  }
}

}  // namespace minidl::optim
