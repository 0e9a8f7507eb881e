// train::ReadBack: when the training loop reads a step's numbers back. On a CUDA device a step's loss, norm and
// overflow flag stay there (StepResult::read) until the loop needs them: on the steps it prints, evaluates, saves or
// stops at and the summary's last 10; every step on the CPU, and every step with fp16 when the learning rate holds
// on skipped steps and is not constant (it needs each skip). Reading settles what the steps since the last read
// decided: the held schedule, the run of skipped steps (--max-skipped-steps), the divergence check.
//
//   train::ReadBack reads(config, schedule, scaler, device, topo.dp_group(), resumed_schedule_step);
//   options.lr = schedule(reads.schedule_step());
//   StepResult r = ...;  reads.stepped();
//   if (reads.every_step() || printing) reads.settle(r, step);   // r.loss is now the global batch's
#pragma once

#include <cstdint>

#include "dist/process_group.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "train/config.h"
#include "train/step.h"

namespace minidl::train {

class ReadBack {
 public:
  // schedule_step: the schedule's position at the first step (a resumed checkpoint's).
  ReadBack(const TrainConfig& config, const optim::CosineSchedule& schedule, optim::GradScaler* scaler, Device device,
           dist::ProcessGroup& dp, int64_t schedule_step);
  int64_t schedule_step() const { return schedule_step_; }
  bool every_step() const { return every_step_; }
  // After each step: the schedule advances now unless it holds on skipped steps (then settle() advances it).
  void stepped();
  // Reads the last step's numbers; throws naming the step when training diverged. Collective over the dp group.
  void settle(StepResult& r, int64_t step);

 private:
  const TrainConfig& o_;
  optim::GradScaler* scaler_;
  dist::ProcessGroup& dp_;
  const bool holds_on_skip_, every_step_;
  int64_t schedule_step_, skipped_seen_, unread_ = 0, in_a_row_ = 0;
};

}  // namespace minidl::train
