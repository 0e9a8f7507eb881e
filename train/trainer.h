// Trainer: a whole GPT training run — topology, model, optimizer, loss scaler, gradient synchronisation, the step
// loop, evaluation, checkpoint, sampling and the summary line — from one TrainConfig. Programs parse flags into a
// TrainConfig and call it; they hold no collective, no DDP call and no rank test.
//
//   dist::Context ctx = dist::init(argc, argv);
//   train::TrainConfig cfg;                    // the defaults are train_gpt's (baby config, Tiny Shakespeare)
//   cfg.steps = 500;
//   cfg.validate(ctx.world_size());            // a clear error for any bad value, before anything is built
//   return train::Trainer(cfg, ctx).run();     // collective: every rank calls it
//
// With cfg.checkpoint_dir set, SIGTERM or SIGUSR1 on any rank makes every rank finish the current step, write a
// checkpoint and return 0; cfg.resume = "auto" continues from the newest one.
//
// Ranks come from one place, dist::Topology{dp, tp, pp}: the sampler slice and the dropout offsets use the dp
// coordinate, DDP and the loss average the dp group, the gradient norm and the overflow flag the model-parallel
// group. The rank at grid coordinate (0, 0, 0) prints.
//
// The summary line (scripts parse it; docs/train_gpt.md documents each field):
//   summary: steps=N train_loss=X val_loss=X ms_per_step=X tokens_per_s=X gflops=X peak_mem_mb=X compute_ms=X
//            comm_ms=X exposed_comm_ms=X loss_scale=X skipped_steps=N act_peak_mb=X param_mb=X grad_mb=X optim_mb=X
//            mfu=X
#pragma once

#include <memory>
#include <string>

#include "train/config.h"

namespace minidl::dist {
class Context;  // dist/init.h: the program includes it to call dist::init
}  // namespace minidl::dist

namespace minidl::train {

// The pipeline of a configuration with pp > 1 (validated): the header line and the per-rank timeline of its
// schedule with the simulated bubble (dist::draw_schedule). Needs no MPI: train_gpt --print-schedule.
std::string describe_pipeline(const TrainConfig& config);

class Trainer {
 public:
  // Collective: builds the topology and its groups, loads the data and a checkpoint, builds the model on its
  // device, and checks that every rank was given the same configuration.
  Trainer(const TrainConfig& config, const dist::Context& ctx);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Collective: trains, evaluates, saves, samples and prints the summary. Returns the exit code (0).
  int run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace minidl::train
