#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>

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

Tensor GradScaler::scale(const Tensor& loss) const { return mul(loss, state_.scale); }

bool GradScaler::unscale_and_check(const std::vector<Tensor>& params) {
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
    unscale_and_check(params);
  }
  ScalerStep result;
  result.scale = state_.scale;
  result.applied = !overflow_;
  if (overflow_) result.reason = "inf/nan in gradients";
  else optimizer.step();
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
}

}  // namespace minidl::optim
