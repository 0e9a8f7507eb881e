// train::Report: what a training run shows besides training, from the step loop's numbers. The progress line every
// --log-every steps (loss, lr, step time, tokens/s, GFLOP/s, MFU, memory, the scaler, communication), the same
// numbers as TensorBoard scalars (--tensorboard), the per-rank straggler line, validation losses, the trace's memory
// track, and the summary line scripts parse (train/trainer.h lists its fields; docs/train_gpt.md documents them).
// Step times: the first step (caches and the allocator warming) is left out of the means; on a device the queue
// drains only when a step is read, so a printed line shows the mean over the steps since the last one.
//
// Beside it, the one-off reports: the first step's proofs by ledger (ZeRO's and tensor parallelism's memory beside
// their predictions, tp traffic) and the pipeline's per-stage activation peaks and measured bubble.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dist/reducer.h"
#include "dist/topology.h"
#include "optim/grad_scaler.h"
#include "train/config.h"
#include "train/progress.h"
#include "train/stage.h"
#include "train/step.h"
#include "train/tensorboard.h"

namespace minidl::train {

struct Meter {
  double flops_per_step = 0, tokens_per_step = 0;
  double peak_tflops = 0;  // MFU's denominator (0: no MFU)
};

class Report {
 public:
  // Prints only on the logging rank (logger); the straggler line gathers from every rank of `topo`.
  Report(const TrainConfig& config, const dist::Topology& topo, Device device, bool logger, Meter meter);
  ~Report();
  // Whether step `step` (0-based) shows a progress line: the same answer on every rank.
  bool shows(int64_t step) const;
  // After step `step` (0-based; first_step: the run's first, untimed) took `ms`, `data_ms` of it drawing the batch:
  // the means, the straggler line (collective over every rank, every --log-every steps at more than one rank) and,
  // when it shows, the progress line and TensorBoard's scalars. `r` must be settled when it shows.
  void stepped(int64_t step, int64_t first_step, double ms, double data_ms, const dist::ReducerStats& comm,
               const StepResult& r, double lr, const optim::GradScaler* scaler);
  // A line that stays (evaluations, checkpoints) above the progress line.
  void print(const std::string& line);
  void validation(int64_t step, double val_loss);  // printed at step (1-based) and logged as val/loss
  // The end of the loop: the progress line finished (before the run's last prints), then the trace written (its
  // path printed) and, after a whole run, the final validation loss logged and the summary line printed.
  void end_progress();
  void end(std::optional<double> val_loss, const optim::GradScaler* scaler);

 private:
  std::string line(int64_t step, double loss, double lr, const optim::GradScaler* scaler);
  void log(int64_t step, const StepResult& r, double lr, const optim::GradScaler* scaler) const;
  void report_stragglers(int64_t step, const std::array<double, 4>& mine);
  void summary(double val_loss, const optim::GradScaler* scaler) const;

  const TrainConfig& o_;
  const dist::Topology& topo_;
  const Device device_;
  const bool logger_;
  const Meter meter_;
  ProgressLine progress_;
  std::unique_ptr<EventWriter> tb_;  // --tensorboard, on the logging rank
  dist::ReducerStats comm_;
  double shown_ms_ = 0, window_ms_ = 0, timed_ms_ = 0, compute_ms_ = 0, comm_ms_ = 0, exposed_ms_ = 0;
  double recent_loss_ = 0;
  std::string loss_log_;  // --loss-log's lines so far
  int64_t window_steps_ = 0, timed_ = 0, recent_ = 0;
};

// One number through a printf format ("%.1f"): the reports' and the notes' text.
std::string fmt(const char* printf_format, double v);

// MFU's peak in TFLOP/s for this rank's share: --peak-tflops, else the GPU's dense peak for the dtype the products
// run in (GPUs in train/device.cpp's table; one it lacks gets none, and the logger says so), else the CPU's sgemm
// ceiling at the step's own product shapes (ops/sgemm_ceiling.h, measured now, one round, summed over the ranks).
// Collective on the CPU.
double mfu_peak_tflops(const TrainConfig& config, const Stage& stage, const dist::Topology& topo, Device device,
                       DType amp, int64_t rows, bool logger);
// The first step's proofs, on every rank. ZeRO (or --memory-report): the bytes held by tag beside
// train/zero_memory.h's prediction. Tensor parallelism: live bytes beside the prediction and the step's tp traffic.
void print_zero_memory(const TrainConfig& config, const Stage& stage, const dist::Topology& topo, Device device,
                       DType amp, int64_t micro_batch, int64_t seq);
void print_tensor_parallel_step(const Stage& stage, const dist::Topology& topo, Device device);
// Every stage's activation peak and measured bubble (time blocked on a peer over its schedule's time), printed by
// the logger. Collective over the pp group.
void print_pipeline_report(const Stage& stage, const dist::Topology& topo, Device device, bool logger);
// --trace's memory track: the ledger's bytes by tag, now.
void trace_memory(Device device);

}  // namespace minidl::train
