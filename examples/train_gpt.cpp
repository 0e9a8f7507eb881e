// train_gpt — trains a GPT-2-shaped character model on a text file and reports its speed and loss.
//
//   build/bin/train_gpt                                  # baby config on the Shakespeare corpus
//   build/bin/train_gpt --layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --steps 500 --save ckpt.safetensors
//   build/bin/train_gpt --init-from ckpt.safetensors --steps 0          # evaluate only
//   build/bin/train_gpt --amp bf16 --recompute block --grad-accum 4     # mixed precision, less memory
//   mpirun -n 2 build/bin/train_gpt --threads 1                         # data parallel over two ranks
//   mpirun -n 2 build/bin/train_gpt --pp 2 --micro-batches 4 --schedule 1f1b   # two pipeline stages
//   build/bin/train_gpt --pp 4 --micro-batches 8 --print-schedule       # draw the schedule, no training
//
// Flags become a train::TrainConfig and train::Trainer does the rest (train/trainer.h, which documents the summary
// line scripts parse). Bad input prints "train_gpt: error: ..." naming what was expected and what was found, exits
// with 2, and writes no file.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "dist/init.h"
#include "train/ps_train.h"
#include "train/trainer.h"

using namespace minidl;

namespace {

// The flag table: every flag in its section (train::TrainConfig's), with its help and default. --help shows the
// sections; --help-markdown prints the same table as docs/train_gpt.md's flag list (TrainGpt.FlagListIsTheHelp
// checks that the document holds exactly it).
void add_flags(CLI::App& app, train::TrainConfig& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  app.option_defaults()->group("Model");
  app.add_option("--data", o.data,
                 "Text file to train on, or GPT-2 token shards in llm.c's format (a glob such as "
                 "'out/shakespeare_*.bin', from tokenize_shards; files named *val* validate, the others train, "
                 "streamed one shard at a time in an order drawn from the seed). A text file: its first 90% of tokens "
                 "train, the last 10% validate")
      ->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer,
                 "char (the corpus's bytes are the tokens), gpt2 (GPT-2's byte-level BPE, 50,257 tokens) or a "
                 "tokenizer.json file (a model's byte-level BPE, as Hugging Face ships it); default: the checkpoint's "
                 "with --init-from or --resume (a model folder's tokenizer.json), else char");
  app.add_option("--gpt2-encoding", o.gpt2_encoding, "GPT-2's encoding file, for --tokenizer gpt2")
      ->capture_default_str();
  // The shape flags are optional: unset, they take the default or, with --init-from, the checkpoint's value.
  app.add_option("--layers", o.layers, "Transformer blocks [default: 4, or the checkpoint's]");
  app.add_option("--heads", o.heads,
                 "Attention heads per block (must divide --embd) [default: 4, or the checkpoint's]");
  app.add_option("--embd", o.embd, "Embedding width C [default: 128, or the checkpoint's]");
  app.add_option("--model", o.model,
                 "Architecture: gpt2 (learned positions, LayerNorm, GELU MLP) or llama (RoPE, RMSNorm, SwiGLU, "
                 "grouped-query attention, no biases) [default: gpt2, or the checkpoint's]");
  app.add_option("--kv-heads", o.kv_heads,
                 "Llama: key/value heads, a divisor of --heads (grouped-query attention; 1: multi-query) "
                 "[default: --heads]");
  app.add_option("--head-dim", o.head_dim, "Llama: the width of a head [default: --embd / --heads]");
  app.add_option("--ffn", o.ffn, "Llama: the SwiGLU MLP's hidden width [default: 4 x --embd]");
  app.add_option("--rope-theta", o.rope_theta, "Llama: RoPE's base theta")->capture_default_str();
  app.add_option("--norm-eps", o.norm_eps, "Llama: the RMSNorms' eps")->capture_default_str();
  app.add_flag("--untie", o.untie, "Llama: an output head of its own (lm_head), not the token embedding");
  app.add_option(
         "--moe-experts", o.moe_experts,
         "Llama: a mixture of experts, E SwiGLU experts of width --ffn per MoE block (nn/moe.h; a Mixtral "
         "with the defaults); 0: dense. Combines with --dp, --pp, --zero, --amp, --recompute and --grad-accum; "
         "not yet with --tp, --cp, --ps, --sync local-sgd/diloco or --cuda-graph. With --init-from: leave every "
         "--moe-* flag out to take the checkpoint's, or give them all as the checkpoint has them")
      ->capture_default_str();
  app.add_option("--moe-top-k", o.moe_top_k, "MoE: experts per token (1 to --moe-experts)")->capture_default_str();
  app.add_option("--moe-every", o.moe_every, "MoE: block i is a mixture of experts when i % N == 0 (1: every block)")
      ->capture_default_str();
  app.add_option("--moe-shared", o.moe_shared,
                 "MoE: shared experts every token passes through (DeepSeek's), as one MLP of N times the width")
      ->capture_default_str();
  app.add_option("--moe-router", o.moe_router,
                 "MoE: softmax (in f32, the top k renormalised: Mixtral) or sigmoid (DeepSeek-V3)")
      ->capture_default_str();
  app.add_option("--moe-balance", o.moe_balance,
                 "MoE: aux (the auxiliary loss alpha E sum f_i P_i, per sequence), bias (auxiliary-loss-free: an "
                 "expert bias that only chooses, moved once per step from the tokens each expert got) or none")
      ->capture_default_str();
  app.add_option("--moe-aux-coef", o.moe_aux_coef, "MoE: alpha, the auxiliary loss's coefficient")
      ->capture_default_str();
  app.add_option("--moe-bias-rate", o.moe_bias_rate, "MoE: the bias update's step (DeepSeek-V3's gamma)")
      ->capture_default_str();
  app.add_option(
      "--moe-capacity", o.moe_capacity,
      "MoE: the capacity factor: an expert takes at most ceil(F T k / E) of each sequence's T tokens' slots, "
      "the earliest first; a dropped slot adds nothing (the token keeps its residual) [default: dropless]");
  app.add_option("--seq", o.seq, "Sequence length T (also the model's block size) [default: 64, or the checkpoint's]");
  app.add_option(
      "--vocab-pad", o.vocab_pad,
      "Store the token embedding / output head with the vocabulary rounded up to a multiple of N rows, so "
      "the head's GEMM and the classifier see aligned rows (GPT-2: 50257 -> 50304), or of N/2, N/4, ... where N's "
      "would add more than an eighth of the vocabulary (65 -> 72); layout only: "
      "checkpoints, losses, samples and parameter counts are those of the real vocabulary. 1: no padding "
      "(ignored with --tp, which pads to a multiple of tp) [default: 64]");
  app.add_option("--dropout", o.dropout, "Dropout probability on embeddings, attention output and MLP output")
      ->capture_default_str();
  app.add_option("--init-from", o.init_from, "Start from this minidl safetensors checkpoint");
  app.option_defaults()->group("Optimizer");
  app.add_option("--batch", o.batch, "Sequences per optimizer step (the global batch)")->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps; 0 with --init-from only evaluates")->capture_default_str();
  app.add_option("--lr", o.lr, "Peak learning rate (AdamW)")->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "Final learning rate of the cosine decay (default: --lr, i.e. constant)");
  app.add_option("--warmup", o.warmup, "Linear warmup steps before the cosine decay")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)")
      ->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "Clip gradients to this global L2 norm; 0 disables")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed for initialisation, batches, dropout and sampling")->capture_default_str();
  app.add_option("--amp", o.amp,
                 "Mixed precision: off, bf16 or fp16. Matrix products and attention in 16-bit with f32 accumulation, "
                 "LayerNorm, softmax and loss math in f32, f32 master weights (autograd/autocast.h's policy table); "
                 "fp16 adds dynamic loss scaling (2^16, x2 after 2000 clean steps, x0.5 on overflow, overflowing "
                 "steps skipped, its state saved with --save); validation and sampling run in f32")
      ->capture_default_str();
  app.add_option("--recompute", o.recompute,
                 "Activation checkpointing per block: none, attn (ln_1 + attention), mlp (ln_2 + MLP) or block")
      ->capture_default_str();
  app.add_option("--max-skipped-steps", o.max_skipped_steps,
                 "fp16: stop after this many consecutive steps the loss scaler skipped (inf/NaN loss or gradients; "
                 "on a CUDA device checked on the steps it prints)")
      ->capture_default_str();
  app.add_option("--loss-scale-init", o.loss_scale_init, "fp16: the loss scaler's first scale (1 to 2^24)")
      ->capture_default_str();
  app.add_option("--loss-scale-growth-interval", o.loss_scale_growth_interval,
                 "fp16: consecutive clean steps before the loss scale doubles")
      ->capture_default_str();
  app.add_flag("--advance-lr-on-skip", o.advance_lr_on_skip,
               "fp16: advance the LR schedule on steps the loss scaler skips (default: hold it)");
  app.option_defaults()->group("Parallel");
  app.add_option("--dp", o.dp,
                 "Data-parallel ranks (run under mpirun -n N); each takes batch/dp of every global batch. "
                 "dp x cp x tp x pp must equal N. Default: N / (cp x tp x pp)");
  app.add_option("--tp", o.tp,
                 "Tensor-parallel ranks: each transformer block split Megatron-style (attention by heads, the MLP "
                 "column then row) and the vocabulary split, over tp consecutive ranks; must divide --heads. "
                 "Combines with --dp, --pp, --zero, --amp, --recompute, --grad-accum, --dropout, clipping and "
                 "training checkpoints (stored as whole tensors: they resume at any --tp). --save writes one "
                 "whole-model file at any --tp, with or without --pp")
      ->capture_default_str();
  app.add_option("--pp", o.pp,
                 "Pipeline stages: each rank holds a contiguous part of the blocks (the first also the "
                 "embedding, the last ln_f, the tied head and the loss); activations move by send/recv. Combines with "
                 "--dp, --tp (stages of tensor-parallel blocks), --zero 0-2, --save, --init-from, --sample and "
                 "training checkpoints (whole tensors: they resume at any --pp, --tp, --dp and --zero)")
      ->capture_default_str();
  app.add_option(
         "--cp", o.cp,
         "Context-parallel ranks: each sequence split into 2 x cp chunks, rank r holding chunks r and "
         "2cp-1-r (equal causal work), attention a ring over the cp ranks (keys and values passed on cp-1 "
         "times, blocks merged by log-sum-exp in f32); positions, dropout and the loss as one process has them. "
         "--seq must be a multiple of 2 x cp; dp x cp x tp x pp must equal N. Combines with --dp, --tp, --pp, "
         "--zero, --amp, --recompute, --grad-accum, --sample and training checkpoints (they resume at any "
         "--cp), on the CPU and on CUDA devices; not with --sequence-parallel or --sync local-sgd/diloco")
      ->capture_default_str();
  app.add_option(
         "--ep", o.ep,
         "Expert-parallel ranks: a mixture of experts' experts spread over groups of ep data-parallel ranks, "
         "each holding E / ep, tokens sent to their experts and back by all-to-alls; must divide --dp and "
         "--moe-experts; an expert's gradient is averaged over the ranks holding it. Training checkpoints resume at "
         "any --ep. Not yet with --zero or --pp")
      ->capture_default_str();
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "With --tp N: split the residual stream (LayerNorm, dropout, residual adds) along the sequence over the "
               "N ranks, all-gathering before and reduce-scattering after the tensor-parallel layers; --seq must be a "
               "multiple of N");
  app.add_option("--micro-batches,--grad-accum", o.micro_batches,
                 "Micro-batches per step (--grad-accum is the same flag): the step's forward and backward run over "
                 "this many equal parts of each rank's batch, their gradients accumulated; with --pp > 1 what the "
                 "pipeline's schedule interleaves (default: --pp); --batch must be a multiple of dp x micro-batches");
  app.add_option("--schedule", o.schedule,
                 "With --pp > 1: gpipe (all forwards, then all backwards), 1f1b (one forward, one backward: at most "
                 "pp - s micro-batches of activations on stage s) or interleaved (1f1b over --virtual-stages chunks "
                 "per rank: a bubble V times smaller; --micro-batches a multiple of --pp)")
      ->capture_default_str();
  app.add_option("--virtual-stages", o.virtual_stages, "With --schedule interleaved: model chunks per rank (V)")
      ->capture_default_str();
  app.add_option("--pp-layers", o.pp_layers,
                 "With --pp > 1: blocks per chunk, comma-separated (pp x virtual-stages counts, e.g. 2,2); default: "
                 "a split balancing the parameter count");
  app.add_flag("--print-schedule", o.print_schedule,
               "Draw the pipeline schedule (per-rank timeline of forwards, backwards and idle slots, with the "
               "simulated bubble) for --pp, --micro-batches, --schedule, --virtual-stages and exit; needs no mpirun");
  app.add_option("--zero", o.zero,
                 "ZeRO stage over the data-parallel ranks: 0 (DDP), 1 (AdamW state sharded: 8/dp bytes per "
                 "parameter), 2 (gradients sharded too: 4/dp), 3 (block parameters sharded too, gathered per block: "
                 "1.5x DDP's communication). With --tp: of the rank's split of the model (0-3); with --pp: of each "
                 "stage's parameters over its dp ranks (0-2)")
      ->capture_default_str();
  app.add_option("--sync", o.sync,
                 "How the data-parallel copies agree: ddp (gradients every step, or ZeRO's, inside the layout), "
                 "local-sgd (every --sync-every steps the --replica-groups replicas' parameters are averaged) or "
                 "diloco (their pseudo-gradients, global - local, averaged and stepped by an outer SGD with Nesterov "
                 "momentum; the global parameters and the momentum in host memory). Any --dp, --tp, --pp and --zero "
                 "0-2 run inside each replica; checkpoints hold every replica's state and resume inside a window")
      ->capture_default_str();
  app.add_option("--sync-every", o.sync_every,
                 "With --sync local-sgd or diloco: H, the inner steps between outer syncs (one all-reduce of the "
                 "parameters per H steps; a last, shorter window is synced at the end)")
      ->capture_default_str();
  app.add_option("--replica-groups", o.replica_groups,
                 "With --sync local-sgd or diloco: R, the replicas of the dp x tp x pp layout (N = R x dp x tp x pp "
                 "ranks); the outer all-reduce joins the ranks at the same coordinates of every replica, and the "
                 "replicas split --batch as an outer data-parallel axis")
      ->capture_default_str();
  app.add_option("--outer-lr", o.outer_lr, "With --sync diloco: the outer SGD's learning rate")->capture_default_str();
  app.add_option("--outer-momentum", o.outer_momentum, "With --sync diloco: the outer SGD's momentum, in [0, 1)")
      ->capture_default_str();
  app.add_option("--nesterov", o.nesterov, "With --sync diloco: Nesterov momentum (true) or plain (false)")
      ->capture_default_str();
  app.add_option("--comm-hook", o.comm_hook,
                 "What DDP's gradient averages send: none (f32), bf16 or fp16 (x / N in 16 bits, summed in 16 bits "
                 "on the wire: half the bytes; PyTorch's bf16/fp16 compress hooks) or powersgd[:RANK] (each matrix's "
                 "average as a rank-RANK approximation, default 4, with error feedback and a warm start; CPU). Not "
                 "with --zero")
      ->capture_default_str();
  app.add_option("--powersgd-start", o.powersgd_start,
                 "With --comm-hook powersgd: plain averages for the first N steps (default: a tenth of --steps)");
  app.add_option("--outer-comm-hook", o.outer_comm_hook,
                 "With --sync diloco: what the pseudo-gradients' average sends: none (f32), bf16 or fp16 (half the "
                 "bytes)")
      ->capture_default_str();
  app.add_option("--ps", o.ps,
                 "S: train through a parameter server on the last S ranks (the others work: each a data-parallel "
                 "share of --batch); the servers hold the parameters, cut at tensor boundaries, and step them with "
                 "AdamW. CPU, f32/bf16; not with --tp, --pp, --zero, --sync, hooks, checkpoints or dropout")
      ->capture_default_str();
  app.add_option("--ps-mode", o.ps_mode,
                 "With --ps: sync (a step's gradients averaged in worker order: DDP), async (each gradient applied "
                 "as it arrives, divided by the workers; stale gradients) or ssp:S (async, but no worker more than S "
                 "steps ahead of the slowest)")
      ->capture_default_str();
  app.add_option("--backup-workers", o.backup_workers,
                 "With --ps 1 --ps-mode sync: b backup workers, each step taking the first workers - b gradients to "
                 "arrive (averaged over them) and dropping the late ones, so a straggler no longer sets the pace "
                 "(Chen et al. 2016); the summary counts the dropped gradients per worker")
      ->capture_default_str();
  app.add_option("--ps-log", o.ps_log,
                 "With --ps: write every applied push of every server (worker, step, version computed on) as JSON "
                 "lines, for --ps-replay");
  app.add_option("--ps-replay", o.ps_replay,
                 "Replay a --ps-log in one process (the same flags otherwise, without --ps): every stale gradient "
                 "recomputed on the versions the log names, applied in each server's order; bitwise the run");
  app.add_option("--backend", o.backend,
                 "Gradient all-reduce for data parallelism: mpi (Open MPI's, CPU), nccl (CUDA) or ring (minidl's, "
                 "either device); default: mpi on the CPU, nccl with --device cuda")
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "Where to train: cpu, cuda (rank r of a host uses GPU r) or cuda:N. On a device the training split "
                 "is uploaded once and each step's batch drawn there (--pp: uploaded per step). A "
                 "-DMINIDL_CUDA_EMULATION=ON build runs cuda on the CPU emulator of CUDA")
      ->capture_default_str();
  app.add_flag("--tf32", o.tf32,
               "Let f32 matrix products on a GPU use TF32 tensor cores (faster, ~1e-3 relative "
               "error); off by default");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "With --device cuda: run 2 steps eagerly, capture the third (forward, backward, clip, optimizer) as a "
               "CUDA graph and replay it every step after, the batch drawn on the device inside it (the learning "
               "rate, the batch's step and the dropout masks' step are written on the device, so replays equal eager "
               "steps); needs one process");
  app.add_option("--threads", o.threads,
                 "CPU threads (kernels and BLAS); default: the host's cores divided among the ranks on it");
  app.option_defaults()->group("Checkpoint");
  app.add_option("--save", o.save, "Write the trained model to this safetensors file (+ config.json beside it)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Folder for training checkpoints (step-XXXXXXXX/: model, AdamW state, schedule, scaler, data "
                 "position, manifest with checksums). With it, SIGTERM/SIGUSR1 finish the step, save and exit 0");
  app.add_option("--save-every", o.save_every, "Write a training checkpoint every N steps and at the end (0: off)")
      ->capture_default_str();
  app.add_option("--keep-last", o.keep_last, "Keep only the newest K training checkpoints (0: all)")
      ->capture_default_str();
  app.add_option("--resume", o.resume,
                 "Continue a run bit for bit from a checkpoint directory, or 'auto': the newest complete one in "
                 "--checkpoint-dir (a fresh start when there is none), so the same command restarts a crashed job");
  app.option_defaults()->group("Sample");
  app.add_option("--sample,--max-new-tokens", o.sample, "After training, generate this many tokens of text")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "With --sample: the text to continue (default: a fresh paragraph)");
  app.add_option("--temperature", o.temperature, "Sampling temperature; 0 takes the most likely token (greedy)")
      ->capture_default_str();
  app.add_option("--top-k", o.top_k, "Draw only among the k most likely tokens (0: all)")->capture_default_str();
  app.add_flag("!--no-kv-cache", o.kv_cache,
               "Recompute the whole window for every generated token instead of "
               "keeping each block's keys and values");
  app.option_defaults()->group("Observe");
  app.add_option("--eval-every", o.eval_every, "Evaluate on the validation split every N steps; 0: only at the end")
      ->capture_default_str();
  app.add_option("--eval-windows", o.eval_windows,
                 "Validation loss = mean over the first N non-overlapping windows of seq+1 tokens")
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "When printing plain lines, print a progress line every N steps")
      ->capture_default_str();
  app.add_option("--progress", o.progress,
                 "Progress display: redraw (one line redrawn in place), lines (a line every --log-every steps) or auto "
                 "(redraw on a terminal, lines in a file, a pipe or under mpirun, whose ranks see a pseudo-terminal)")
      ->capture_default_str();
  app.add_flag("--memory-report", o.memory_report,
               "After the first step every rank prints its memory by tag beside the predicted bytes (always on "
               "with --zero 1-3); with --tp the prediction is the rank's split; not with --pp");
  app.add_option("--loss-log", o.loss_log,
                 "Write every step's loss to this file when the run ends, one 'step loss' line each with 17 "
                 "significant digits (bit-exact): the golden-loss replays of tests/golden/ compare it");
  app.add_option("--tensorboard", o.tensorboard,
                 "Write TensorBoard event files to this directory (tensorboard --logdir DIR): train/loss, val/loss, "
                 "lr, grad_norm, loss_scale, skipped_steps, tokens_per_s, mfu, step_ms, exposed_comm_ms and memory by "
                 "ledger tag, at every --log-every step");
  app.add_option("--trace", o.trace,
                 "Write a Chrome trace per rank to this directory (rank<R>.json; open in https://ui.perfetto.dev or "
                 "chrome://tracing; scripts/merge_traces.py joins them): steps, data, forwards and backwards, "
                 "pipeline waits, the optimizer, DDP's bucket collectives and the wait for them, memory by tag");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "MFU's peak in TFLOP/s per rank (0: the GPU's dense peak from its name, or the CPU's measured sgemm "
                 "ceiling); for a GPU the table does not know")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.option_defaults()->group("Debug");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "Seconds a collective or send/recv may take before every rank that can still run writes its flight "
                 "recorder to --debug-dir and the job ends (exit code 3) naming the group, the sequence number, the "
                 "op and the ranks that have not joined it (default: $MINIDL_COLLECTIVE_TIMEOUT, else 600; 0: off)");
  app.add_option("--debug-dir", o.debug_dir,
                 "Where the watchdog writes each rank's progress and, on a timeout, flight recorder "
                 "(scripts/flight_recorder.py reads them); all ranks must see it (default: $MINIDL_DEBUG_DIR, else "
                 "$TMPDIR or /tmp, in minidl-<job id>)");
  app.add_option("--inject-delay", o.inject_delay,
                 "RANK:MS: world rank RANK sleeps MS ms at the start of every step, a straggler on demand (a test and "
                 "benchmark tool: bench/stragglers.py; the per-rank straggler line names it)");
  app.add_flag("--check-collectives", o.check_collectives,
               "Before every collective the ranks of its group exchange its fingerprint (op, dtype, count, root, "
               "reduce op, sequence number) on a side channel, and a receive checks its send's: a mismatch stops "
               "every rank naming both calls and their ranks (debugging; MINIDL_CHECK_COLLECTIVES=1 for any program)");
}

// The flag table in Markdown, one row per flag, a bold row opening each section.
std::string flags_markdown(const CLI::App& app) {
  std::string md = "| flag | default | meaning |\n|---|---|---|\n", section;
  // Paths in the source tree (the default data) as the repository names them, whoever built the program.
  const std::string root = std::filesystem::path(MINIDL_DEFAULT_DATA).parent_path().parent_path().string() + "/";
  auto cell = [](std::string text) {
    for (size_t at = 0; (at = text.find('|', at)) != std::string::npos; at += 2) text.insert(at, "\\");
    return text;
  };
  for (const CLI::Option* opt : app.get_options()) {
    if (opt == app.get_help_ptr()) continue;
    if (opt->get_group() != section) md += "| **" + (section = opt->get_group()) + "** | | |\n";
    std::string names;
    for (const std::string& n : opt->get_lnames()) names += (names.empty() ? "`--" : "`, `--") + n;
    names += opt->get_type_size() == 0 ? "`" : " " + opt->get_type_name() + "`";
    std::string value = opt->get_default_str();
    if (value.rfind(root, 0) == 0) value.erase(0, root.size());
    md += "| " + cell(names) + " | " + (value.empty() ? "—" : "`" + cell(value) + "`") + " | " +
          cell(opt->get_description()) + " |\n";
  }
  return md;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI first (a plain process is a world of one). Every rank parses the same flags; rank 0 speaks for them.
  dist::Context ctx = dist::init(argc, argv);
  const bool speaks = ctx.rank() == 0;
  CLI::App app{
      "Train a GPT-2-shaped language model (characters or GPT-2 tokens) with minidl.\n"
      "Data-parallel: mpirun -n N build/bin/train_gpt [flags] (--batch is the global batch)."};
  train::TrainConfig config;
  config.data = MINIDL_DEFAULT_DATA;
  config.gpt2_encoding = MINIDL_DEFAULT_GPT2_ENCODING;
  add_flags(app, config);
  double plan_gib = 0;
  app.add_option("--plan-memory", plan_gib,
                 "Print which ZeRO stages, --recompute settings and micro-batches fit in this many GiB per rank for "
                 "the model and world size given (cheapest communication first), and exit without training")
      ->group("Parallel");
  bool markdown = false;
  app.add_flag("--help-markdown", markdown, "Print this flag list as a Markdown table (docs/train_gpt.md's) and exit")
      ->group("Options");
  // Flag errors are the same on every rank: each returns 2 and MPI finalises normally.
  try {
    app.parse(argc, argv);
    if (markdown) return speaks ? std::printf("%s", flags_markdown(app).c_str()), 0 : 0;
    if (config.print_schedule) {  // a drawing of the flags' schedule, for any number of ranks
      config.validate(std::max(config.dp, 1) * config.cp * config.tp * config.pp);
      if (speaks) std::printf("%s", train::describe_pipeline(config).c_str());
      return 0;
    }
    config.validate(ctx.world_size());
  } catch (const CLI::CallForHelp& e) { return speaks ? app.exit(e) : 0; } catch (const CLI::ParseError& e) {
    if (speaks) std::fprintf(stderr, "train_gpt: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    if (speaks) std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    return 2;
  }
  // Later errors (any exception: minidl's, a JSON parser's, the standard library's) may hit one rank while the
  // others wait in a collective: that rank stops the whole job.
  auto fail = [&](const char* what) {
    if (ctx.world_size() > 1) {
      std::fprintf(stderr, "\ntrain_gpt: error (rank %d): %s\n", ctx.rank(), what);
      ctx.abort(2);
    }
    std::fprintf(stderr, "\ntrain_gpt: error: %s\n", what);
    return 2;
  };
  try {
    if (plan_gib != 0) {
      const std::string plan = train::plan_memory(config, ctx.world_size(), plan_gib);
      if (speaks) std::fputs(plan.c_str(), stdout);
      return 0;
    }
    if (config.ps > 0) return train::train_with_parameter_server(config, ctx);
    if (!config.ps_replay.empty()) return train::replay_parameter_server(config);
    return train::Trainer(config, ctx).run();
  } catch (const std::exception& e) { return fail(e.what()); } catch (...) {
    return fail("unknown exception");
  }
}
