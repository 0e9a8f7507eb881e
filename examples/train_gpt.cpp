// train_gpt — trains a GPT-2-shaped character model on a text file and reports its speed and loss.
//
//   build/bin/train_gpt                                  # baby config on the Shakespeare corpus
//   build/bin/train_gpt --layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --steps 500 --save ckpt.safetensors
//   build/bin/train_gpt --init-from ckpt.safetensors --steps 0          # evaluate only
//   build/bin/train_gpt --amp bf16 --recompute block --grad-accum 4     # mixed precision, less memory
//   mpirun -n 2 build/bin/train_gpt --threads 1                         # data parallel over two ranks
//
// Ends with one line that scripts parse (documented in README.md):
//   summary: steps=N train_loss=X val_loss=X ms_per_step=X tokens_per_s=X gflops=X peak_mem_mb=X compute_ms=X
//            comm_ms=X exposed_comm_ms=X loss_scale=X skipped_steps=N act_peak_mb=X param_mb=X grad_mb=X optim_mb=X
// Bad input prints "train_gpt: error: ..." naming what was expected and what was found, exits with 2, and writes
// no file.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "core/parallel.h"
#include "data/text_dataset.h"
#include "dist/ddp.h"
#include "dist/init.h"
#include "examples/gpt_training.h"
#include "examples/progress.h"
#include "nn/checkpoint.h"
#include "ops/matmul.h"
#include "optim/schedule.h"

using namespace minidl;

namespace {

struct Options {
  std::string data = MINIDL_DEFAULT_DATA;
  int64_t layers = 4, heads = 4, embd = 128, seq = 64, batch = 12, steps = 2000;
  double lr = 1e-3, weight_decay = 0.1, dropout = 0.0, grad_clip = 1.0, temperature = 1.0;
  std::optional<double> min_lr;
  int64_t warmup = 0;
  uint64_t seed = 1337;
  int threads = 0;
  int64_t eval_every = 250, eval_windows = 256, log_every = 10, sample = 0;
  std::string save, init_from;
  int dp = 0;                  // data-parallel ranks; 0: the world size
  std::string backend;         // process-group backend for DDP; empty: mpi on the CPU, nccl on CUDA devices
  int64_t grad_accum = 1;
  std::string amp = "off", recompute = "none";
  bool advance_lr_on_skip = false;
  std::string device = "cpu";
  bool tf32 = false;
};

DType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return DType::bf16;
  if (amp == "fp16") return DType::f16;
  MINIDL_CHECK(amp == "off", "--amp: expected off, bf16 or fp16, got '", amp, "'");
  return DType::f32;
}

// GradScalerState <-> the JSON string stored in a checkpoint's metadata under "grad_scaler".
std::string scaler_state_json(const optim::GradScalerState& s) {
  return nlohmann::json{{"scale", s.scale},
                        {"clean_steps", s.clean_steps},
                        {"overflows_left", s.overflows_left},
                        {"skipped_steps", s.skipped_steps}}
      .dump();
}
optim::GradScalerState scaler_state_from_json(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  return {j.at("scale").get<double>(), j.at("clean_steps").get<int64_t>(), j.at("overflows_left").get<int64_t>(),
          j.at("skipped_steps").get<int64_t>()};
}

void add_flags(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  app.add_option("--data", o.data, "Text file to train on (bytes are the tokens)")->capture_default_str();
  app.add_option("--layers", o.layers, "Transformer blocks")->capture_default_str();
  app.add_option("--heads", o.heads, "Attention heads per block (must divide --embd)")->capture_default_str();
  app.add_option("--embd", o.embd, "Embedding width C")->capture_default_str();
  app.add_option("--seq", o.seq, "Sequence length T (also the model's block size)")->capture_default_str();
  app.add_option("--batch", o.batch, "Sequences per optimizer step (the global batch)")->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps; 0 with --init-from only evaluates")->capture_default_str();
  app.add_option("--lr", o.lr, "Peak learning rate (AdamW)")->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "Final learning rate of the cosine decay (default: --lr, i.e. constant)");
  app.add_option("--warmup", o.warmup, "Linear warmup steps before the cosine decay")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)")
      ->capture_default_str();
  app.add_option("--dropout", o.dropout, "Dropout probability on embeddings, attention output and MLP output")
      ->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "Clip gradients to this global L2 norm; 0 disables")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed for initialisation, batches, dropout and sampling")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (kernels and BLAS); default: all cores");
  app.add_option("--eval-every", o.eval_every, "Evaluate on the validation split every N steps; 0: only at the end")
      ->capture_default_str();
  app.add_option("--eval-windows", o.eval_windows,
                 "Validation loss = mean over the first N non-overlapping windows of seq+1 tokens")
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "When not on a terminal, print a progress line every N steps")
      ->capture_default_str();
  app.add_option("--save", o.save, "Write the trained model to this safetensors file (+ config.json beside it)");
  app.add_option("--init-from", o.init_from, "Start from this minidl safetensors checkpoint");
  app.add_option("--sample", o.sample, "After training, generate this many characters of text")->capture_default_str();
  app.add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  app.add_option("--dp", o.dp,
                 "Data-parallel ranks (run under mpirun -n N); each takes batch/dp of every global batch. "
                 "Default: the number of ranks");
  app.add_option("--backend", o.backend,
                 "Gradient all-reduce for data parallelism: mpi (Open MPI's, CPU), nccl (CUDA) or ring (minidl's, "
                 "either device); default: mpi on the CPU, nccl with --device cuda")
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum,
                 "Split each step's --batch into this many micro-batches (gradient accumulation)")
      ->capture_default_str();
  app.add_option("--amp", o.amp, "Mixed precision: off, bf16 or fp16 (fp16 adds dynamic loss scaling)")
      ->capture_default_str();
  app.add_option("--recompute", o.recompute,
                 "Activation checkpointing per block: none, attn (ln_1 + attention), mlp (ln_2 + MLP) or block")
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "Where to train: cpu, cuda (rank r of a host uses GPU r) or cuda:N. A -DMINIDL_CUDA_EMULATION=ON "
                 "build runs cuda on the CPU emulator of CUDA")
      ->capture_default_str();
  app.add_flag("--tf32", o.tf32, "Let f32 matrix products on a GPU use TF32 tensor cores (faster, ~1e-3 relative "
               "error); off by default");
  app.add_flag("--advance-lr-on-skip", o.advance_lr_on_skip,
               "fp16: advance the LR schedule on steps the loss scaler skips (default: hold it)");
}

void validate(const Options& o, int world) {
  MINIDL_CHECK(o.dp == 0 || o.dp == world, "--dp ", o.dp, " does not match the ", world,
               " ranks this job runs on (mpirun -n); data parallelism is the only parallelism, so they must be equal");
  // The global batch splits into dp ranks x grad_accum micro-batches of equal size.
  const int64_t dp = world;
  MINIDL_CHECK(o.batch >= 1, "--batch: expected at least 1, got ", o.batch);
  MINIDL_CHECK(o.grad_accum >= 1, "--grad-accum: expected at least 1, got ", o.grad_accum);
  MINIDL_CHECK(o.batch % (dp * o.grad_accum) == 0, "--batch ", o.batch, " does not split into ", dp,
               " data-parallel rank(s) x --grad-accum ", o.grad_accum,
               " equal micro-batches: --batch must be a multiple of ", dp * o.grad_accum);
  MINIDL_CHECK(o.backend.empty() || o.backend == "mpi" || o.backend == "ring" || o.backend == "nccl",
               "--backend: expected mpi, ring or nccl, got '", o.backend, "'");
  MINIDL_CHECK(o.layers >= 1, "--layers: expected at least 1, got ", o.layers);
  MINIDL_CHECK(o.heads >= 1, "--heads: expected at least 1, got ", o.heads);
  MINIDL_CHECK(o.embd >= 1 && o.embd % o.heads == 0, "--embd: expected a positive multiple of --heads (", o.heads,
               "), got ", o.embd);
  MINIDL_CHECK(o.seq >= 1, "--seq: expected at least 1, got ", o.seq);
  MINIDL_CHECK(o.steps >= 0, "--steps: expected 0 or more, got ", o.steps);
  MINIDL_CHECK(o.steps > 0 || !o.init_from.empty(), "--steps 0 only evaluates, which needs --init-from");
  MINIDL_CHECK(o.lr > 0 && std::isfinite(o.lr), "--lr: expected a positive number, got ", o.lr);
  MINIDL_CHECK(!o.min_lr || (*o.min_lr >= 0 && *o.min_lr <= o.lr), "--min-lr: expected a value in [0, --lr = ", o.lr,
               "], got ", o.min_lr.value_or(0));
  MINIDL_CHECK(o.warmup >= 0 && (o.warmup <= o.steps), "--warmup: expected 0 to --steps (", o.steps, "), got ",
               o.warmup);
  MINIDL_CHECK(o.weight_decay >= 0, "--weight-decay: expected 0 or more, got ", o.weight_decay);
  MINIDL_CHECK(o.dropout >= 0 && o.dropout < 1, "--dropout: expected a probability in [0, 1), got ", o.dropout);
  MINIDL_CHECK(o.grad_clip >= 0, "--grad-clip: expected 0 (off) or a positive norm, got ", o.grad_clip);
  MINIDL_CHECK(o.threads >= 0, "--threads: expected a positive count, got ", o.threads);
  MINIDL_CHECK(o.eval_every >= 0, "--eval-every: expected 0 or more, got ", o.eval_every);
  MINIDL_CHECK(o.eval_windows >= 1, "--eval-windows: expected at least 1, got ", o.eval_windows);
  MINIDL_CHECK(o.log_every >= 1, "--log-every: expected at least 1, got ", o.log_every);
  MINIDL_CHECK(o.sample >= 0, "--sample: expected 0 or more, got ", o.sample);
  amp_dtype(o.amp);
  nn::parse_recompute(o.recompute);
  MINIDL_CHECK(o.temperature > 0, "--temperature: expected a positive number, got ", o.temperature);
  if (!o.save.empty()) {
    auto dir = std::filesystem::absolute(o.save).parent_path();
    MINIDL_CHECK(std::filesystem::is_directory(dir), "--save: directory ", dir.string(), " does not exist");
  }
}

// The model configuration: from the flags, or from the checkpoint (flags given explicitly must agree with it).
nn::GPTConfig model_config(const Options& o, const CLI::App& app, const nn::GPTCheckpoint* ckpt, int64_t vocab) {
  nn::GPTConfig cfg{vocab, o.seq, o.layers, o.heads, o.embd, o.dropout, true};
  if (!ckpt) return cfg;
  const nn::GPTConfig& c = ckpt->config;
  auto agree = [&](const char* flag, int64_t given, int64_t stored) {
    MINIDL_CHECK(app.count(flag) == 0 || given == stored, flag, " ", given, " does not match the checkpoint ",
                 o.init_from, ", which has ", stored);
  };
  agree("--layers", o.layers, c.n_layer);
  agree("--heads", o.heads, c.n_head);
  agree("--embd", o.embd, c.n_embd);
  MINIDL_CHECK(app.count("--seq") == 0 || o.seq <= c.block_size, "--seq ", o.seq, " is longer than the checkpoint ",
               o.init_from, "'s block size ", c.block_size);
  cfg = c;
  cfg.dropout = o.dropout;
  return cfg;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// What every rank must agree on; a difference stops every rank with a message naming the fields.
std::vector<std::pair<std::string, std::string>> config_fields(const Options& o, const data::TextDataset& ds) {
  auto str = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  return {{"data", o.data + " (" + str(ds.train().size()) + " train tokens)"},
          {"layers", str(o.layers)}, {"heads", str(o.heads)}, {"embd", str(o.embd)}, {"seq", str(o.seq)},
          {"batch", str(o.batch)}, {"steps", str(o.steps)}, {"lr", str(o.lr)}, {"min_lr", str(o.min_lr.value_or(-1))},
          {"warmup", str(o.warmup)}, {"weight_decay", str(o.weight_decay)}, {"dropout", str(o.dropout)},
          {"grad_clip", str(o.grad_clip)}, {"seed", str(o.seed)}, {"init_from", o.init_from},
          {"backend", o.backend}, {"dp", str(o.dp)}};
}

int run(const Options& o, const CLI::App& app, const dist::Context& ctx) {
  const bool rank0 = ctx.rank() == 0;
  const int dp = ctx.world_size();
  set_num_threads(o.threads > 0 ? o.threads : ctx.threads_per_rank());

  std::optional<nn::GPTCheckpoint> ckpt;
  std::optional<data::CharTokenizer> vocab;
  if (!o.init_from.empty()) {
    ckpt = nn::load_gpt(o.init_from);
    auto it = ckpt->metadata.find("vocab");
    MINIDL_CHECK(it != ckpt->metadata.end(), "--init-from ", o.init_from, ": the checkpoint has no \"vocab\" metadata");
    vocab = data::CharTokenizer::from_json(nlohmann::json::parse(it->second));
  }
  data::TextDataset ds = vocab ? data::TextDataset(o.data, *vocab) : data::TextDataset(o.data);
  if (dp > 1) dist::check_same_config(ctx, config_fields(o, ds));
  const int64_t seq = app.count("--seq") || !ckpt ? o.seq : ckpt->config.block_size;
  MINIDL_CHECK(int64_t(ds.train().size()) >= seq + 1 && int64_t(ds.val().size()) >= seq + 1, "--data ", o.data,
               ": expected at least ", seq + 1, " tokens in each split for --seq ", seq, ", found ", ds.train().size(),
               " (train) and ", ds.val().size(), " (validation)");
  // Non-overlapping windows of seq + 1 tokens; asking for more than the split holds uses them all.
  const int64_t windows = std::min<int64_t>(o.eval_windows, int64_t(ds.val().size()) / (seq + 1));
  nn::GPTConfig cfg = model_config(o, app, ckpt ? &*ckpt : nullptr, ds.tokenizer().size());

  const Device device = train::select_device(o.device, ctx.local_rank());
  ops::set_allow_tf32(o.tf32);
  const std::string backend = !o.backend.empty() ? o.backend : device.is_cpu() ? "mpi" : "nccl";
  MINIDL_CHECK(device.is_cpu() ? backend != "nccl" : backend != "mpi", "--backend ", backend, " does not serve --device ",
               o.device, ": use ", device.is_cpu() ? "mpi or ring on the CPU" : "nccl or ring on CUDA devices");
  nn::GPT model(cfg, o.seed);
  if (ckpt) nn::load_into(model, o.init_from);
  model.to(device);  // before the optimizer, whose state follows the parameters' device
  model.train();
  // Data parallelism: every rank holds the model and takes samples [rank * local, (rank + 1) * local) of each
  // global batch; DDP averages the gradients during backward.
  const int64_t local_batch = o.batch / dp, first_sample = ctx.rank() * local_batch;
  std::unique_ptr<dist::ProcessGroup> group;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (dp > 1) {
    group = dist::make_process_group(backend, ctx.world(), device);
    ddp = std::make_unique<dist::DistributedDataParallel>(model, *group);
  }
  model.dropout_context().first_sample = first_sample;
  model.set_recompute(nn::parse_recompute(o.recompute));
  const DType amp = amp_dtype(o.amp);
  std::optional<optim::GradScaler> scaler;
  if (amp == DType::f16) {
    scaler.emplace();
    auto it = ckpt ? ckpt->metadata.find("grad_scaler") : nn::Metadata::const_iterator{};
    if (ckpt && it != ckpt->metadata.end()) scaler->load_state(scaler_state_from_json(it->second));
    // Every rank skips a step when any rank's gradients overflowed (after DDP's averaging they all see the same
    // gradients, so this only makes the rule explicit and independent of how the gradients were reduced).
    if (group)
      scaler->combine_overflow = [&group, device](bool local) {
        Tensor flag = Tensor::full({1}, local ? 1.0 : 0.0, DType::f32, device);
        group->all_reduce(flag, dist::ReduceOp::kMax)->wait();
        return flag.item() > 0;
      };
  }
  optim::AdamW optimizer(optim::decay_groups(model.named_parameters(), o.weight_decay), {o.lr});
  optim::CosineSchedule schedule(o.lr, o.min_lr.value_or(o.lr), o.warmup, std::max<int64_t>(o.steps, 1));
  data::BatchSampler sampler(ds.train(), seq, o.batch, o.seed);
  data::Batch val = data::eval_windows(ds.val(), seq, windows);

  if (rank0) {
    std::printf("minidl train_gpt: %lld parameters, layers=%lld heads=%lld embd=%lld seq=%lld batch=%lld vocab=%lld "
                "threads=%d dp=%d grad_accum=%lld amp=%s recompute=%s device=%s data=%s (%zu train / %zu val tokens)\n",
                (long long)model.num_parameters(), (long long)cfg.n_layer, (long long)cfg.n_head,
                (long long)cfg.n_embd, (long long)seq, (long long)o.batch, (long long)cfg.vocab_size, num_threads(), dp,
                (long long)o.grad_accum, o.amp.c_str(), o.recompute.c_str(),
                device.is_cpu() ? "cpu" : (o.device + " (" + train::device_name(device) + ")").c_str(), o.data.c_str(),
                ds.train().size(),
                ds.val().size());
    if (amp == DType::bf16) std::printf("amp bf16: no loss scaling needed (bf16 has f32's exponent range)\n");
    if (scaler)
      std::printf("amp fp16: dynamic loss scaling from %g (x%g every %lld clean steps, x%g on overflow)\n",
                  scaler->current_scale(), scaler->options().growth_factor,
                  (long long)scaler->options().growth_interval, scaler->options().backoff_factor);
    std::fflush(stdout);
  }

  const double tokens_per_step = double(o.batch * seq);  // the global batch
  const double flops_per_step = model.flops_per_token(seq) * tokens_per_step;
  train::StepOptions step_options;
  step_options.grad_clip = o.grad_clip;
  step_options.grad_accum = o.grad_accum;
  step_options.amp = amp;
  step_options.scaler = scaler ? &*scaler : nullptr;
  std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
  if (ddp)  // all-reduce only on the last micro-batch's backward; local accumulation before it
    step_options.grad_sync = [&](bool sync) {
      no_sync.reset();
      if (!sync) no_sync.emplace(*ddp);
    };
  train::ProgressLine progress(o.log_every, rank0);
  int64_t schedule_step = 0;  // holds still on skipped steps unless --advance-lr-on-skip
  double timed_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0, recent_loss = 0, val_loss = NAN;
  int64_t timed_steps = 0, recent = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    double lr = schedule(schedule_step);
    auto t0 = std::chrono::steady_clock::now();
    data::Batch batch = sampler.batch(step, first_sample, local_batch);
    step_options.lr = lr;
    train::StepResult r = train::train_step(model, optimizer, batch, step_options);
    no_sync.reset();
    if (r.applied || o.advance_lr_on_skip) ++schedule_step;
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    dist::DDPStepStats comm = ddp ? ddp->last_step() : dist::DDPStepStats{};
    if (group) {  // the global batch's loss: the mean of the ranks' (equal-sized) slices
      Tensor loss = Tensor::full({1}, r.loss, DType::f64, device);  // on the group's device
      group->all_reduce(loss, dist::ReduceOp::kAvg)->wait();
      r.loss = loss.item();
    }
    MINIDL_CHECK(std::isfinite(r.loss), "training diverged: loss is ", r.loss, " at step ", step + 1,
                 "; try a lower --lr");
    if (step > 0 || o.steps == 1) {  // the first step warms caches and the allocator
      timed_ms += ms;
      compute_ms += ms - comm.exposed_comm_ms;
      comm_ms += comm.comm_ms;
      exposed_ms += comm.exposed_comm_ms;
      ++timed_steps;
    }
    if (step >= o.steps - 10) {
      recent_loss += r.loss;
      ++recent;
    }
    std::string line = "step " + std::to_string(step + 1) + "/" + std::to_string(o.steps) + " | loss " +
                       fmt("%.4f", r.loss) + " | lr " + fmt("%.2e", lr) + " | " + fmt("%.1f", ms) + " ms | " +
                       fmt("%.0f", tokens_per_step / ms * 1e3) + " tok/s | " + fmt("%.1f", flops_per_step / ms / 1e6) +
                       " GFLOP/s | peak " + fmt("%.0f", train::peak_rss_mb()) + " MB";
    if (scaler)
      line += " | scale " + fmt("%g", scaler->current_scale()) + " | skipped " + std::to_string(scaler->skipped_steps());
    if (ddp)
      line += " | comm " + fmt("%.1f", comm.comm_ms) + " ms, exposed " + fmt("%.1f", comm.exposed_comm_ms) + " ms";
    progress.update(step + 1, o.steps, line);
    bool last = step + 1 == o.steps;
    if (rank0 && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && !last)
      progress.print("step " + std::to_string(step + 1) + ": val_loss " +
                     fmt("%.4f", train::evaluate(model, val, o.batch)));
  }
  progress.finish();
  if (!rank0) return 0;  // ranks hold identical weights: rank 0 evaluates, saves and samples

  val_loss = train::evaluate(model, val, o.batch);
  std::printf("validation: %.4f over %lld windows of %lld tokens\n", val_loss, (long long)windows, (long long)seq);
  if (!o.save.empty()) {
    nn::Metadata extras{{"steps", std::to_string(o.steps)}, {"val_loss", fmt("%.6f", val_loss)}};
    if (scaler) extras["grad_scaler"] = scaler_state_json(scaler->state());
    nn::save_gpt(o.save, model, ds.tokenizer().to_json().dump(), extras);
    std::printf("saved %s\n", o.save.c_str());
  }
  if (o.sample > 0) {
    // Start from a newline when the vocabulary has one (a fresh paragraph), else from token 0.
    const auto& v = ds.tokenizer().vocab();
    std::vector<int32_t> prompt{std::binary_search(v.begin(), v.end(), uint8_t('\n')) ? ds.tokenizer().encode("\n")[0] : 0};
    std::vector<int32_t> out = train::sample(model, prompt, o.sample, o.temperature, o.seed);
    std::printf("---- sample ----\n%s\n----------------\n", ds.tokenizer().decode(out).c_str());
  }
  auto per_step = [&](double total) { return timed_steps ? total / double(timed_steps) : 0.0; };
  double ms_per_step = per_step(timed_ms);
  const MemoryLedger& mem = ledger(device);  // the training device's ledger (the GPU's, with --device cuda)
  auto mb = [&](MemTag tag) { return double(mem.peak(tag)) / double(1 << 20); };
  std::printf("summary: steps=%lld train_loss=%.4f val_loss=%.4f ms_per_step=%.2f tokens_per_s=%.0f gflops=%.2f "
              "peak_mem_mb=%.1f compute_ms=%.2f comm_ms=%.2f exposed_comm_ms=%.2f loss_scale=%g skipped_steps=%lld "
              "act_peak_mb=%.2f param_mb=%.2f grad_mb=%.2f optim_mb=%.2f\n",
              (long long)o.steps, recent ? recent_loss / double(recent) : NAN, val_loss, ms_per_step,
              ms_per_step > 0 ? tokens_per_step / ms_per_step * 1e3 : 0.0,
              ms_per_step > 0 ? flops_per_step / ms_per_step / 1e6 : 0.0, train::peak_rss_mb(), per_step(compute_ms),
              per_step(comm_ms), per_step(exposed_ms), scaler ? scaler->current_scale() : 1.0,
              (long long)(scaler ? scaler->skipped_steps() : 0), mb(MemTag::kActivations), mb(MemTag::kParams),
              mb(MemTag::kGrads), mb(MemTag::kOptimizer));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI first (a plain process is a world of one). Every rank parses the same flags; rank 0 speaks for them.
  dist::Context ctx = dist::init(argc, argv);
  const bool rank0 = ctx.rank() == 0;
  CLI::App app{"Train a GPT-2-shaped character-level language model with minidl.\n"
               "Data-parallel: mpirun -n N build/bin/train_gpt [flags] (--batch is the global batch)."};
  Options o;
  add_flags(app, o);
  // Flag errors are the same on every rank: each returns 2 and MPI finalises normally.
  try {
    app.parse(argc, argv);
    validate(o, ctx.world_size());
  } catch (const CLI::CallForHelp& e) {
    return rank0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    if (rank0) std::fprintf(stderr, "train_gpt: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const Error& e) {
    if (rank0) std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    return 2;
  }
  // Later errors may hit one rank while the others wait in a collective: that rank stops the whole job.
  try {
    return run(o, app, ctx);
  } catch (const Error& e) {
    if (ctx.world_size() > 1) {
      std::fprintf(stderr, "\ntrain_gpt: error (rank %d): %s\n", ctx.rank(), e.what());
      ctx.abort(2);
    }
    std::fprintf(stderr, "\ntrain_gpt: error: %s\n", e.what());
    return 2;
  }
}
