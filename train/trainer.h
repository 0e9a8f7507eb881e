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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/text_dataset.h"

namespace minidl::dist {
class Context;  // dist/init.h: the program includes it to call dist::init
}  // namespace minidl::dist

namespace minidl::train {

struct TrainConfig {
  std::string data;  // text file
  // "char" (the corpus's bytes are the tokens) or "gpt2" (GPT-2's byte-level BPE, read from gpt2_encoding); empty:
  // the checkpoint's (--init-from, --resume), else char.
  std::string tokenizer;
  std::string gpt2_encoding;  // GPT-2's encoding file (data/gpt2.tiktoken)
  // Model shape: unset means the default (4, 4, 128, 64) or, with init_from, the checkpoint's; set ones must
  // agree with a checkpoint.
  std::optional<int64_t> layers, heads, embd, seq;
  int64_t vocab_pad = 64;  // nn::GPTConfig::vocab_pad: the head's table padded to a multiple (1: none)
  int64_t batch = 12, steps = 2000;
  double lr = 1e-3, weight_decay = 0.1, dropout = 0.0, grad_clip = 1.0, temperature = 1.0;
  std::optional<double> min_lr;  // default: lr (constant)
  int64_t warmup = 0;
  uint64_t seed = 1337;
  int threads = 0;  // 0: the host's cores divided among its ranks
  int64_t eval_every = 250, eval_windows = 256, log_every = 10, sample = 0;
  // Generation after training (sample > 0 tokens): the text it continues (empty: a fresh paragraph), the top-k
  // filter (0: every token) and the KV cache (train::generate).
  std::string prompt;
  int64_t top_k = 0;
  bool kv_cache = true;
  std::string progress = "auto";  // auto | redraw | lines (train/progress.h)
  std::string save, init_from;
  // Training checkpoints (train/checkpoint.h): directories step-XXXXXXXX/ in checkpoint_dir, every save_every steps
  // (0: none) and when SIGTERM/SIGUSR1 asks the run to stop (only with a checkpoint_dir); keep_last of them (0: all).
  std::string checkpoint_dir;
  int64_t save_every = 0, keep_last = 0;
  // A checkpoint directory to continue from, bit for bit, or "auto": the newest complete one in checkpoint_dir
  // (a fresh start when there is none), so the same command line restarts a job after any crash.
  std::string resume;
  int dp = 0, tp = 1, pp = 1;  // dp 0: the world size / (tp · pp)
  // tp > 1: the residual stream between the tensor-parallel layers split along the sequence (dist/sequence_parallel.h)
  bool sequence_parallel = false;
  // The schedule every step runs (train/stage.h, train/step.h): micro-batches per step (--micro-batches, alias
  // --grad-accum; unset: pp), and with pp > 1 the schedule (gpipe, 1f1b, interleaved), model chunks per rank
  // (interleaved), blocks per chunk ("2,2,...", empty: split by parameter count); print_schedule: draw the schedule
  // and exit (programs do it with describe_pipeline, without training).
  std::optional<int64_t> micro_batches;
  std::string schedule = "1f1b", pp_layers;
  int virtual_stages = 1;
  bool print_schedule = false;
  std::string backend;  // empty: mpi on the CPU, nccl on CUDA devices
  // ZeRO stage over the dp group (dist/zero.h, dist/zero3.h): 0 = DDP, 1 = optimizer state sharded, 2 = gradients
  // too, 3 = block parameters too.
  int zero = 0;
  // After the first step every rank prints its ledger beside train/zero_memory.h's prediction (always with --zero).
  bool memory_report = false;
  std::string amp = "off", recompute = "none";
  bool advance_lr_on_skip = false;
  // fp16: a run stops after this many consecutive steps the loss scaler skipped (the scale has then fallen by
  // 2^N: the model produces inf/NaN whatever the scale, which no amount of backing off will fix).
  int64_t max_skipped_steps = 50;
  // fp16's loss scaler: its first scale and the clean steps between growths (optim::GradScalerOptions' defaults).
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;
  std::string device = "cpu";
  bool tf32 = false;
  // MFU's peak in TFLOP/s per rank; 0: the GPU's dense peak from the table by name (train::gpu_peak_tflops), or on
  // the CPU the sgemm ceiling measured at the step's shapes.
  double peak_tflops = 0;
  bool cuda_graph = false;  // capture one step as a CUDA graph and replay it (train/cuda_graph.h)
  // The watchdog (dist/flight_recorder.h): seconds a collective may take before every rank dumps its flight
  // recorder into debug_dir and the job ends naming the ranks that did not join (unset: MINIDL_COLLECTIVE_TIMEOUT,
  // else 600; 0: off); debug_dir empty: MINIDL_DEBUG_DIR, else a directory in $TMPDIR or /tmp named for the job.
  std::optional<double> collective_timeout;
  std::string debug_dir;
  // Before every collective the ranks compare its fingerprint (op, dtype, count, root, reduce op, sequence number)
  // and all stop naming both sides of a mismatch (dist::set_checking_collectives; a cost per call).
  bool check_collectives = false;
  // TensorBoard event files (train/tensorboard.h) in this directory, from the logging rank: the progress line's
  // numbers at every printed step, the validation loss, memory by ledger tag. Empty: none.
  std::string tensorboard;
  // A Chrome trace per rank in this directory (core/trace.h: rank<R>.json, the ranks' clocks started together):
  // steps, data, each forward and backward, waits for pipeline peers, the optimizer, DDP's buckets on the
  // communication thread and the wait for them, evaluation, checkpoints, memory by ledger tag. Empty: none.
  std::string trace;

  int64_t layers_or_default() const { return layers.value_or(4); }
  int64_t heads_or_default() const { return heads.value_or(4); }
  int64_t embd_or_default() const { return embd.value_or(128); }
  int64_t seq_or_default() const { return seq.value_or(64); }
  int64_t micro_batches_or_default() const { return micro_batches.value_or(pp); }
  // Throws minidl::Error naming the flag, what was expected and what was given. Same answer on every rank.
  void validate(int world_size) const;
};

// The run's dataset: --data as a text file tokenized with `saved` (a checkpoint's tokenizer), --tokenizer or the
// file's characters; or, for a shard pattern (data/token_shards.h), its shards' GPT-2 ids.
data::TextDataset open_dataset(const TrainConfig& config, const data::Tokenizer* saved);

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

// --plan-memory: the configurations of ZeRO stage, --recompute and micro-batch whose predicted memory per rank
// fits `gib` GiB for this config's model (the vocabulary read from --data) on `world` ranks, cheapest in
// communication first (train::memory_plan in train/zero_memory.h).
std::string plan_memory(const TrainConfig& config, int world, double gib);

}  // namespace minidl::train
