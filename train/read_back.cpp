#include "train/read_back.h"

#include <cmath>

#include "train/grad_sync.h"

namespace minidl::train {

ReadBack::ReadBack(const TrainConfig& o, const optim::CosineSchedule& schedule, optim::GradScaler* scaler,
                   Device device, dist::ProcessGroup& dp, int64_t schedule_step)
    : o_(o),
      scaler_(scaler),
      dp_(dp),
      holds_on_skip_(scaler && !o.advance_lr_on_skip),
      every_step_(!device.is_cuda() || !o.loss_log.empty() ||
                  (holds_on_skip_ && !(o.warmup == 0 && schedule.min_lr() == schedule.lr()))),
      schedule_step_(schedule_step),
      skipped_seen_(scaler ? scaler->skipped_steps() : 0) {}

void ReadBack::stepped() {
  if (!holds_on_skip_) ++schedule_step_;
  ++unread_;
}

void ReadBack::settle(StepResult& r, int64_t step) {
  if (unread_ == 0) return;
  r.read();
  // The global batch's loss: the mean of the dp ranks' (equal-sized) slices.
  if (dp_.size() > 1) r.loss = sum_over(dp_, r.loss) / dp_.size();
  if (scaler_) {
    const int64_t skipped = scaler_->skipped_steps(), new_skips = skipped - skipped_seen_;
    skipped_seen_ = skipped;
    if (holds_on_skip_) schedule_step_ += unread_ - new_skips;
    // A non-finite loss or gradient is an overflow the scaler skipped and backed off from; only a long run of
    // them means the model itself is broken. Between reads a run counts only the skips known to be in a row.
    in_a_row_ = new_skips == unread_ ? in_a_row_ + new_skips : (r.applied ? 0 : 1);
    MINIDL_CHECK(in_a_row_ < o_.max_skipped_steps, "training diverged: the fp16 loss scaler skipped ", in_a_row_,
                 " steps in a row (loss ", r.loss, ", scale now ", scaler_->current_scale(), ") at step ", step + 1,
                 "; try a lower --lr or --amp bf16");
  } else {
    MINIDL_CHECK(std::isfinite(r.loss), "training diverged: loss is ", r.loss, " at step ", step + 1,
                 "; try a lower --lr");
  }
  unread_ = 0;
}

}  // namespace minidl::train
