// Learning-rate schedule: linear warmup, then cosine decay to a floor — nanoGPT's get_lr, exactly:
//
//   step <  warmup:           lr * (step + 1) / warmup          (reaches lr at step warmup - 1)
//   warmup <= step < total:   min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr),  r = (step - warmup) / (total - warmup)
//   step >= total:            min_lr
//
// So lr(warmup) == lr, the decay is monotone, and the last step (total - 1) is just above min_lr (r < 1: the
// curve would reach min_lr at step == total, as nanoGPT's lr_decay_iters). warmup == 0 starts the cosine at once;
// min_lr == lr gives a constant schedule (CosineSchedule::constant).
//
//   optim::CosineSchedule schedule(/*lr=*/6e-4, /*min_lr=*/6e-5, /*warmup=*/100, /*total=*/5000);
//   opt.set_lr(schedule(step));
#pragma once

#include <cstdint>

namespace minidl::optim {

class CosineSchedule {
 public:
  CosineSchedule(double lr, double min_lr, int64_t warmup, int64_t total);
  static CosineSchedule constant(double lr) { return CosineSchedule(lr, lr, 0, 1); }

  // The learning rate for 0-based step `step` (>= 0).
  double operator()(int64_t step) const;

  double lr() const { return lr_; }
  double min_lr() const { return min_lr_; }
  int64_t warmup() const { return warmup_; }
  int64_t total() const { return total_; }

 private:
  double lr_, min_lr_;
  int64_t warmup_, total_;
};

}  // namespace minidl::optim
