#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace minidl::optim {

CosineSchedule::CosineSchedule(double lr, double min_lr, int64_t warmup, int64_t total)
    : lr_(lr), min_lr_(min_lr), warmup_(warmup), total_(total) {
  MINIDL_CHECK(lr >= 0.0, "CosineSchedule: expected lr >= 0, got ", lr);
  MINIDL_CHECK(min_lr >= 0.0 && min_lr <= lr, "CosineSchedule: expected 0 <= min_lr <= lr (", lr, "), got ", min_lr);
  MINIDL_CHECK(total >= 1, "CosineSchedule: expected total >= 1 step, got ", total);
  MINIDL_CHECK(warmup >= 0 && warmup <= total, "CosineSchedule: expected 0 <= warmup <= total (", total, "), got ",
               warmup);
}

double CosineSchedule::operator()(int64_t step) const {
  MINIDL_CHECK(step >= 0, "CosineSchedule: expected step >= 0, got ", step);
  if (step < warmup_) return lr_ * double(step + 1) / double(warmup_);
  if (step >= total_) return min_lr_;
  double ratio = double(step - warmup_) / double(total_ - warmup_);
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr_ + coeff * (lr_ - min_lr_);
}

}  // namespace minidl::optim
