// train_gpt --ps S: training through a parameter server (dist/parameter_server.h), and its one-process replay.
//
//   mpirun -n 3 build/bin/train_gpt --ps 1 --ps-mode async --ps-log ps.jsonl --save a.safetensors   // 2 workers
//   build/bin/train_gpt --ps-replay ps.jsonl --save b.safetensors      // the same flags otherwise: b = a, bitwise
//
// The last S ranks serve, the others work. Every rank builds the one-process model (its initialisation from
// --seed). Server j holds whole parameters (the flat vector cut at tensor boundaries) and steps them with AdamW as a
// DDP rank steps its copy (train::apply_step: clipping over the whole gradient when one server holds it all, the
// weight-decay groups, the LR schedule at the step, or at pushes / W asynchronously). Worker w trains on samples
// [w·b, (w + 1)·b) of each global batch (b = batch / W), as DDP rank w does, through the one executor
// (train::train_step): its optimizer step pushes the gradient and takes the parameters back. So --ps-mode sync
// is DDP at W ranks: bitwise at W = 2 (a sum of two is the same either way round).
//
// Rank 0 (worker 0) reports: the loss every --log-every steps, the final model's validation loss (after every
// worker's last gradient), the staleness histogram, SSP's bound checked in every server's log, and writes --ps-log
// (JSON lines: a header, then every applied push of every server) and --save. --ps-replay reads such a log and
// recomputes the run in one process (dist::ps_replay): every stale gradient on the versions the log names, applied
// in each server's order.
#pragma once

#include "train/config.h"

namespace minidl::dist {
class Context;  // dist/init.h: the program includes it to call dist::init
}  // namespace minidl::dist

namespace minidl::train {

// Collective over the job. Returns the exit code.
int train_with_parameter_server(const TrainConfig& config, const dist::Context& ctx);
// One process: config.ps_replay's run again.
int replay_parameter_server(const TrainConfig& config);

}  // namespace minidl::train
