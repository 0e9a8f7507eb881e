// TrainConfig: everything a training run is told, in the sections train_gpt's --help shows (model, optimizer,
// parallel, checkpoint, sample, observe, debug; examples/train_gpt.cpp's flag table names each field's flag, and
// `train_gpt --help-markdown` prints docs/train_gpt.md's flag list from the same table), and what is derived from it
// alone: its validation, the data-parallel size, the dataset, the model's configuration, the fields every rank
// must agree on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "data/text_dataset.h"
#include "nn/gpt.h"

namespace minidl::train {

struct TrainConfig {
  // ---- model: the data, its tokenizer and the GPT's shape
  std::string data;  // a text file, or token shards (data/token_shards.h)
  // "char" (the corpus's bytes are the tokens), "gpt2" (GPT-2's byte-level BPE, read from gpt2_encoding) or a
  // tokenizer.json's path (a model's byte-level BPE); empty: the checkpoint's (--init-from, --resume; a model folder's
  // tokenizer.json), else char.
  std::string tokenizer;
  std::string gpt2_encoding;  // GPT-2's encoding file (data/gpt2.tiktoken)
  // Unset means the default (4, 4, 128, 64) or, with init_from, the checkpoint's; set ones must agree with it.
  std::optional<int64_t> layers, heads, embd, seq;
  // The architecture (nn::GPTConfig::Arch): "gpt2" or "llama"; empty: the checkpoint's, else gpt2. Llama's shape:
  // key/value heads (unset: heads), head width (unset: embd / heads), the MLP's width (unset: 4 embd), RoPE's
  // base, the RMSNorms' eps and an untied head.
  std::string model;
  std::optional<int64_t> kv_heads, head_dim, ffn;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  bool untie = false;
  // A mixture of experts (nn/moe.h; needs --model llama): experts per MoE block (0: dense), experts per token, MoE
  // in every n-th block, shared experts, the router (softmax | sigmoid), the balancing (aux | bias | none), the
  // auxiliary loss's coefficient, the bias update's rate, and the capacity factor (unset: dropless).
  int64_t moe_experts = 0, moe_top_k = 2, moe_every = 1, moe_shared = 0;
  std::string moe_router = "softmax", moe_balance = "aux";
  double moe_aux_coef = 0.01, moe_bias_rate = 1e-3;
  std::optional<double> moe_capacity;
  int64_t vocab_pad = 64;  // nn::GPTConfig::vocab_pad: the head's table padded to a multiple (1: none)
  double dropout = 0.0;
  std::string init_from;  // a model file to start from

  // ---- optimizer: AdamW, its schedule, clipping, mixed precision
  int64_t batch = 12, steps = 2000;
  double lr = 1e-3, weight_decay = 0.1, grad_clip = 1.0;
  std::optional<double> min_lr;  // default: lr (constant)
  int64_t warmup = 0;
  uint64_t seed = 1337;
  std::string amp = "off", recompute = "none";
  bool advance_lr_on_skip = false;
  // fp16: a run stops after this many consecutive steps the loss scaler skipped (the scale has then fallen by
  // 2^N: the model produces inf/NaN whatever the scale, which no amount of backing off will fix).
  int64_t max_skipped_steps = 50;
  // fp16's loss scaler: its first scale and the clean steps between growths (optim::GradScalerOptions' defaults).
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;

  // ---- parallel: the grid, the schedule, ZeRO, the backend and the device
  int dp = 0, tp = 1, pp = 1;  // dp 0: the world size / (cp · tp · pp)
  // Context parallelism: each sequence split over cp ranks (head-tail), attention a ring (dist/context_parallel.h)
  int cp = 1;
  int ep = 1;  // expert parallelism: the experts spread over groups of ep data-parallel ranks (dist/expert_parallel.h)
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
  // ZeRO stage over the dp group (dist/zero.h, dist/zero3.h): 0 = DDP, 1 = optimizer state sharded, 2 = gradients
  // too, 3 = block parameters too.
  int zero = 0;
  // How the replicas agree (dist/local_sgd.h): "ddp" (every step, through the layout's own gradient sync; one
  // replica), or "local-sgd" / "diloco" every sync_every steps across replica_groups copies of the dp × tp × pp grid
  // (world = replica_groups · dp · tp · pp), DiLoCo with an outer SGD of outer_lr, outer_momentum, Nesterov or not.
  std::string sync = "ddp";
  int64_t sync_every = 1;
  int replica_groups = 1;
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool nesterov = true;
  // What DDP's gradient averages and DiLoCo's pseudo-gradient average send (dist/comm_hook.h): none, bf16, fp16;
  // DDP's also powersgd[:RANK] (dist/powersgd.h, rank 4 by default), plain averages for its first powersgd_start
  // steps (unset: a tenth of the steps).
  std::string comm_hook = "none", outer_comm_hook = "none";
  std::optional<int64_t> powersgd_start;
  // A parameter server (train/ps_train.h): the last ps ranks serve, the rest work; ps_mode "sync", "async" or
  // "ssp:S"; ps_log a JSON-lines file of every applied push; ps_replay such a file, replayed in one process.
  int ps = 0;
  std::string ps_mode = "sync", ps_log, ps_replay;
  // Sync with one server: each step takes the first workers − backup_workers gradients and drops the late ones.
  int backup_workers = 0;
  // comm_hook's PowerSGD rank, or 0 when it is not powersgd[:RANK]; throws on a malformed rank.
  int powersgd_rank() const;
  std::string backend;  // empty: mpi on the CPU, nccl on CUDA devices
  std::string device = "cpu";
  bool tf32 = false;
  bool cuda_graph = false;  // capture one step as a CUDA graph and replay it (train/cuda_graph.h)
  int threads = 0;          // 0: the host's cores divided among its ranks

  // ---- checkpoint: the model file, training checkpoints (train/checkpoint.h) and resuming
  std::string save;
  // Directories step-XXXXXXXX/ in checkpoint_dir, every save_every steps (0: none) and when SIGTERM/SIGUSR1 asks the
  // run to stop (only with a checkpoint_dir); keep_last of them (0: all).
  std::string checkpoint_dir;
  int64_t save_every = 0, keep_last = 0;
  // A checkpoint directory to continue from, bit for bit, or "auto": the newest complete one in checkpoint_dir
  // (a fresh start when there is none), so the same command line restarts a job after any crash.
  std::string resume;

  // ---- sample: generation after training (sample > 0 tokens, train::generate)
  int64_t sample = 0;
  std::string prompt;  // the text it continues (empty: a fresh paragraph)
  double temperature = 1.0;
  int64_t top_k = 0;  // 0: every token
  bool kv_cache = true;

  // ---- observe: evaluation, progress, reports, TensorBoard, traces, MFU
  int64_t eval_every = 250, eval_windows = 256, log_every = 10;
  std::string progress = "auto";  // auto | redraw | lines (train/progress.h)
  // After the first step every rank prints its ledger beside train/zero_memory.h's prediction (always with --zero).
  bool memory_report = false;
  // TensorBoard event files (train/tensorboard.h) in this directory, from the logging rank: the progress line's
  // numbers at every printed step, the validation loss, memory by ledger tag. Empty: none.
  std::string tensorboard;
  // Every step's loss (the global batch's), one "step loss" line each with 17 significant digits, written by the
  // logging rank when the run ends (via a temporary: a run that fails writes none): what a golden-loss replay
  // compares bit for bit (tests/golden/). Empty: none. On a device it reads every step's loss back.
  std::string loss_log;
  // A Chrome trace per rank in this directory (core/trace.h: rank<R>.json, the ranks' clocks started together):
  // steps, data, each forward and backward, waits for pipeline peers, the optimizer, DDP's buckets on the
  // communication thread and the wait for them, evaluation, checkpoints, memory by ledger tag. Empty: none.
  std::string trace;
  // MFU's peak in TFLOP/s per rank; 0: the GPU's dense peak from the table by name (train::gpu_peak_tflops), or on
  // the CPU the sgemm ceiling measured at the step's shapes.
  double peak_tflops = 0;

  // ---- debug: the watchdog and collective checks (dist/flight_recorder.h)
  // Seconds a collective may take before every rank dumps its flight recorder into debug_dir and the job ends
  // naming the ranks that did not join (unset: MINIDL_COLLECTIVE_TIMEOUT, else 600; 0: off); debug_dir empty:
  // MINIDL_DEBUG_DIR, else a directory in $TMPDIR or /tmp named for the job.
  std::optional<double> collective_timeout;
  std::string debug_dir;
  // Before every collective the ranks compare its fingerprint (op, dtype, count, root, reduce op, sequence number)
  // and all stop naming both sides of a mismatch (dist::set_checking_collectives; a cost per call).
  bool check_collectives = false;
  // "RANK:MS": world rank RANK sleeps MS milliseconds at the start of every step (a test and benchmark tool: a
  // straggler on demand, named by the per-rank straggler line). Empty: none.
  std::string inject_delay;
  // inject_delay parsed: {rank, ms}, or {-1, 0} for none; throws naming the flag on a malformed value.
  std::pair<int, int> injected_delay() const;

  int64_t layers_or_default() const { return layers.value_or(4); }
  int64_t heads_or_default() const { return heads.value_or(4); }
  int64_t embd_or_default() const { return embd.value_or(128); }
  int64_t seq_or_default() const { return seq.value_or(64); }
  int64_t micro_batches_or_default() const { return micro_batches.value_or(pp); }
  // Throws minidl::Error naming the flag, what was expected and what was given. Same answer on every rank.
  void validate(int world_size) const;
  void validate_outer_sync(int world_size) const;        // --sync and its flags (part of validate)
  void validate_parameter_server(int world_size) const;  // --ps, --ps-replay and what they exclude (part of it)
  void validate_moe() const;                             // the --moe-* flags and what an MoE refuses (part of validate)
  void validate_context_parallel() const;                // --cp's divisibility and what it refuses (part of validate)
};

// The data-parallel size: --dp, or the world size divided by cp · tp · pp (and the replicas).
int dp_size(const TrainConfig& config, int world);
// --amp's compute dtype: f32 (off), bf16 or f16.
DType amp_dtype(const std::string& amp);

// The run's dataset: --data as a text file tokenized with `saved` (a checkpoint's tokenizer), --tokenizer or the
// file's characters; or, for a shard pattern (data/token_shards.h), its shards' GPT-2 ids.
data::TextDataset open_dataset(const TrainConfig& config, const data::Tokenizer* saved);

// The model's configuration for a vocabulary of `vocab`: from the flags, or from `checkpoint` (read from
// `source`, which a mismatch names), with which the shape flags given explicitly must agree.
nn::GPTConfig model_config(const TrainConfig& config, int64_t vocab, const nn::GPTConfig* checkpoint,
                           const std::string& source);

// What every rank must agree on (dist::check_same_config) and a training checkpoint records: everything that
// changes the data, the model, the numerics or the collectives.
std::vector<std::pair<std::string, std::string>> agreed_fields(const TrainConfig& config, const data::TextDataset& ds);

// --plan-memory: the configurations of ZeRO stage, --recompute and micro-batch whose predicted memory per rank
// fits `gib` GiB for this config's model (the vocabulary read from --data) on `world` ranks, cheapest in
// communication first (train::memory_plan in train/zero_memory.h).
std::string plan_memory(const TrainConfig& config, int world, double gib);

}  // namespace minidl::train
