#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <cstring>

#include "core/parallel.h"
#include "core/trace.h"
#include "data/text_dataset.h"
#include "data/shard_sampler.h"
#include "data/token_shards.h"
#include "dist/clock_sync.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "dist/topology.h"
#include "dist/tensor_parallel.h"
#include "nn/checkpoint.h"
#include "nn/param_layout.h"
#include "ops/matmul.h"
#include "ops/sgemm_ceiling.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/cuda_graph.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/grad_sync.h"
#include "train/parallel_model.h"
#include "train/progress.h"
#include "train/step.h"
#include "train/tensorboard.h"
#include "train/zero_memory.h"

namespace minidl::train {

namespace {

DType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return DType::bf16;
  if (amp == "fp16") return DType::f16;
  MINIDL_CHECK(amp == "off", "--amp: expected off, bf16 or fp16, got '", amp, "'");
  return DType::f32;
}

// A field of a model file's metadata holding JSON, read by `read`; any error names the file, the field and what was
// expected.
template <class F>
auto metadata_field(const std::string& file, const nn::Metadata& metadata, const std::string& field,
                    const char* expected, F read) {
  const std::string& text = metadata.at(field);
  try {
    return read(text);
  } catch (const std::exception& e) {
    MINIDL_CHECK(false, file, ": __metadata__ field \"", field, "\": expected ", expected, ", got '",
                 text.substr(0, 80), "' (", e.what(), ")");
    throw;
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// The data-parallel size: --dp, or the world size divided by tp · pp.
int dp_size(const TrainConfig& c, int world) { return c.dp > 0 ? c.dp : std::max(1, world / (c.tp * c.pp)); }

}  // namespace

void TrainConfig::validate(int world) const {
  if (!tokenizer.empty()) data::Tokenizer::check_kind(tokenizer);
  MINIDL_CHECK(tp >= 1, "--tp: expected at least 1, got ", tp);
  MINIDL_CHECK(pp >= 1, "--pp: expected at least 1, got ", pp);
  MINIDL_CHECK(dp >= 0, "--dp: expected at least 1, got ", dp);
  MINIDL_CHECK(heads_or_default() % tp == 0, "--tp ", tp, " must divide --heads ", heads_or_default(),
               " (attention is split by heads)");
  MINIDL_CHECK(!sequence_parallel || tp > 1,
               "--sequence-parallel splits the sequence over the tensor-parallel "
               "ranks: it needs --tp 2 or more, got --tp ",
               tp);
  MINIDL_CHECK(!sequence_parallel || seq_or_default() % tp == 0, "--sequence-parallel: --seq ", seq_or_default(),
               " must be a multiple of --tp ", tp);
  MINIDL_CHECK(!memory_report || pp == 1, "--memory-report with --pp ", pp,
               ": the prediction is per whole model "
               "(or its tensor-parallel split), not per pipeline stage; the summary's act_peak_mb, param_mb, "
               "grad_mb and optim_mb and the per-stage activation peaks are measured");
  if (cuda_graph) validate_cuda_graph(*this, world);
  const int d = dp_size(*this, world);
  MINIDL_CHECK(int64_t(d) * tp * pp == world, "--dp ", d, " x --tp ", tp, " x --pp ", pp, " = ", int64_t(d) * tp * pp,
               " does not match the ", world, " ranks this job runs on (mpirun -n)");
  // The global batch splits into dp ranks x micro-batches of equal size.
  MINIDL_CHECK(batch >= 1, "--batch: expected at least 1, got ", batch);
  validate_pipeline(*this, d);
  MINIDL_CHECK(zero >= 0 && zero <= 3, "--zero: expected 0, 1, 2 or 3, got ", zero);
  MINIDL_CHECK(backend.empty() || backend == "mpi" || backend == "ring" || backend == "nccl",
               "--backend: expected mpi, ring or nccl, got '", backend, "'");
  MINIDL_CHECK(layers_or_default() >= 1, "--layers: expected at least 1, got ", layers_or_default());
  MINIDL_CHECK(heads_or_default() >= 1, "--heads: expected at least 1, got ", heads_or_default());
  MINIDL_CHECK(embd_or_default() >= 1 && embd_or_default() % heads_or_default() == 0,
               "--embd: expected a positive multiple of --heads (", heads_or_default(), "), got ", embd_or_default());
  MINIDL_CHECK(seq_or_default() >= 1, "--seq: expected at least 1, got ", seq_or_default());
  MINIDL_CHECK(steps >= 0, "--steps: expected 0 or more, got ", steps);
  MINIDL_CHECK(steps > 0 || !init_from.empty(), "--steps 0 only evaluates, which needs --init-from");
  MINIDL_CHECK(save_every >= 0, "--save-every: expected 0 (off) or a positive number of steps, got ", save_every);
  MINIDL_CHECK(keep_last >= 0, "--keep-last: expected 0 (all) or a positive count, got ", keep_last);
  MINIDL_CHECK(!checkpoint_dir.empty() || (save_every == 0 && resume != "auto"),
               save_every > 0 ? "--save-every" : "--resume auto", " needs --checkpoint-dir");
  MINIDL_CHECK(resume.empty() || init_from.empty(),
               "--resume and --init-from exclude each other: --resume continues "
               "a run (weights, optimizer, schedule, data position), --init-from starts a new one from weights");
  MINIDL_CHECK(lr > 0 && std::isfinite(lr), "--lr: expected a positive number, got ", lr);
  MINIDL_CHECK(!min_lr || (*min_lr >= 0 && *min_lr <= lr), "--min-lr: expected a value in [0, --lr = ", lr, "], got ",
               min_lr.value_or(0));
  MINIDL_CHECK(warmup >= 0 && warmup <= steps, "--warmup: expected 0 to --steps (", steps, "), got ", warmup);
  MINIDL_CHECK(weight_decay >= 0, "--weight-decay: expected 0 or more, got ", weight_decay);
  MINIDL_CHECK(dropout >= 0 && dropout < 1, "--dropout: expected a probability in [0, 1), got ", dropout);
  MINIDL_CHECK(grad_clip >= 0, "--grad-clip: expected 0 (off) or a positive norm, got ", grad_clip);
  MINIDL_CHECK(threads >= 0, "--threads: expected a positive count, got ", threads);
  MINIDL_CHECK(eval_every >= 0, "--eval-every: expected 0 or more, got ", eval_every);
  MINIDL_CHECK(eval_windows >= 1, "--eval-windows: expected at least 1, got ", eval_windows);
  MINIDL_CHECK(log_every >= 1, "--log-every: expected at least 1, got ", log_every);
  MINIDL_CHECK(sample >= 0, "--sample: expected 0 or more, got ", sample);
  MINIDL_CHECK(max_skipped_steps >= 1, "--max-skipped-steps: expected at least 1, got ", max_skipped_steps);
  MINIDL_CHECK(loss_scale_init >= 1 && loss_scale_init <= 16777216.0,
               "--loss-scale-init: expected a scale from 1 to 2^24 (16777216), got ", loss_scale_init);
  MINIDL_CHECK(loss_scale_growth_interval >= 1, "--loss-scale-growth-interval: expected at least 1, got ",
               loss_scale_growth_interval);
  parse_progress_mode(progress);
  amp_dtype(amp);
  nn::parse_recompute(recompute);
  MINIDL_CHECK(temperature >= 0, "--temperature: expected 0 (greedy) or a positive number, got ", temperature);
  MINIDL_CHECK(top_k >= 0, "--top-k: expected 0 (every token) or more, got ", top_k);
  MINIDL_CHECK(!collective_timeout || (*collective_timeout >= 0 && std::isfinite(*collective_timeout)),
               "--collective-timeout: expected 0 (off) or a number of seconds, got ", collective_timeout.value_or(0));
  if (!checkpoint_dir.empty() && std::filesystem::exists(checkpoint_dir))
    MINIDL_CHECK(std::filesystem::is_directory(checkpoint_dir), "--checkpoint-dir: ", checkpoint_dir,
                 " exists and is not a directory");
  if (!save.empty()) {
    auto dir = std::filesystem::absolute(save).parent_path();
    MINIDL_CHECK(std::filesystem::is_directory(dir), "--save: directory ", dir.string(), " does not exist");
  }
}

data::TextDataset open_dataset(const TrainConfig& o, const data::Tokenizer* saved) {
  const bool shards = data::names_token_shards(o.data);
  // Token shards hold GPT-2's ids (llm.c's scripts): they default to its tokenizer.
  const std::string kind = saved ? saved->kind() : !o.tokenizer.empty() ? o.tokenizer : shards ? "gpt2" : "char";
  if (shards) {
    MINIDL_CHECK(kind == "gpt2", "--data ", o.data, ": token shards hold GPT-2's ids, expected --tokenizer gpt2, got ",
                 kind);
    return data::TextDataset::from_shards(o.data, saved ? *saved : data::Tokenizer::gpt2(o.gpt2_encoding));
  }
  if (saved) return data::TextDataset(o.data, *saved);
  if (kind == "gpt2") return data::TextDataset(o.data, data::Tokenizer::gpt2(o.gpt2_encoding));
  return data::TextDataset(o.data);
}

std::string plan_memory(const TrainConfig& o, int world, double gib) {
  MINIDL_CHECK(gib > 0 && std::isfinite(gib), "--plan-memory: expected a positive number of GiB, got ", gib);
  const data::TextDataset ds = open_dataset(o, nullptr);
  nn::GPTConfig m{int64_t(ds.tokenizer().size()),
                  o.seq_or_default(),
                  o.layers_or_default(),
                  o.heads_or_default(),
                  o.embd_or_default(),
                  o.dropout,
                  true,
                  o.vocab_pad};
  m.validate();
  return memory_plan(m, dp_size(o, world), amp_dtype(o.amp), o.batch, gib * double(1ull << 30));
}

struct Trainer::State {
  TrainConfig cfg;
  std::unique_ptr<dist::Topology> topo;
  bool logger = false;  // the rank at grid coordinate (0, 0, 0) prints
  Device device;
  DType amp = DType::f32;
  std::optional<nn::GPTCheckpoint> ckpt;  // --init-from's, or the resumed checkpoint's model file
  std::string ckpt_source;                // what a mismatch message names
  std::optional<Checkpoint> resume;
  std::vector<std::string> notes;  // printed by the logger once it is known
  std::optional<data::TextDataset> ds;
  int64_t seq = 0, windows = 0, local_batch = 0, first_sample = 0;
  std::unique_ptr<Stage> stage;  // this rank's chunks: the whole model at pp = 1 (train/stage.h)
  int64_t num_params = 0;        // the whole model's (collective to count with pp > 1)
  std::unique_ptr<GradSync> sync;
  std::optional<optim::GradScaler> scaler;
  std::unique_ptr<optim::AdamW> optimizer;

  nn::GPTConfig model_config(int64_t vocab) const;
  std::vector<std::pair<std::string, std::string>> config_fields() const;
  void print_header() const;
  // Collective: checkpoint_dir/step-N, every rank writing its share, the logger the rest; every rank waits for it.
  // Returns the directory, with its size and the time the write took on the logger.
  std::string save_checkpoint(int64_t steps_done, int64_t schedule_step) const;
  void print_zero_memory() const;
  void print_tensor_parallel_step() const;
  // Collective: the validation loss (ZeRO-3: the parameters held whole meanwhile, the ranks evaluating different
  // batches).
  double evaluate(const data::Batch& val) const;
  // Collective: the run's end after the last step (its checkpoint, the validation loss, --save, the sample, the
  // pipeline's per-stage report); returns the validation loss.
  double finish(const data::Batch& val, int64_t schedule_step) const;
  void print_pipeline_report() const;
  double cpu_ceiling_tflops() const;
};

// ZeRO's proof by ledger, on every rank after the first step: the bytes held by tag beside train/zero_memory.h's
// prediction for this stage, dp size, --amp, --recompute and micro-batch, and the difference. Parameters, gradients
// and optimizer state are what is held between steps (padding: < N elements per bucket); activations the peak
// (an estimate, the formula's known approximation).
void Trainer::State::print_zero_memory() const {
  const MemoryLedger& mem = ledger(device);
  const int64_t M = stage->spec().micro_batches;
  MemoryQuery q{stage->config(),
                cfg.zero,
                topo->grid().dp,
                amp,
                stage->chunk(0).recompute(),
                local_batch / M,
                seq,
                M,
                topo->grid().tp,
                cfg.sequence_parallel};
  const MemoryPlan p = predict_memory(q);
  const double mib = double(1 << 20);
  auto pct = [](double measured, double predicted) { return predicted > 0 ? 100 * (measured / predicted - 1) : 0.0; };
  const double params = double(mem.current(MemTag::kParams)), grads = double(mem.current(MemTag::kGrads)),
               optimizer = double(mem.current(MemTag::kOptimizer)), acts = double(mem.peak(MemTag::kActivations));
  std::printf(
      "zero-%d memory, dp rank %d of %d: params=%.3f grads=%.3f optimizer=%.3f activations=%.3f comm=%.3f "
      "MiB; predicted params=%.3f grads=%.3f optimizer=%.3f activations=%.3f MiB; difference params=%+.1f%% "
      "grads=%+.1f%% optimizer=%+.1f%% activations=%+.1f%%\n",
      cfg.zero, topo->coord().dp, topo->grid().dp, params / mib, grads / mib, optimizer / mib, acts / mib,
      double(mem.current(MemTag::kComm)) / mib, p.params_rest / mib, p.grads_rest / mib, p.optimizer / mib,
      p.activations / mib, pct(params, p.params_rest), pct(grads, p.grads_rest), pct(optimizer, p.optimizer),
      pct(acts, p.activations));
  std::fflush(stdout);
}

// Tensor parallelism's proof by ledger and counters, on every rank after the first step: this rank's live bytes
// by tag beside the prediction (split parameters / tp + replicated ones, f32), and what the step asked the tp
// group to move (dist::tensor_parallel_traffic: payload bytes; docs/parallelism.md has the formula).
void Trainer::State::print_tensor_parallel_step() const {
  const MemoryLedger& mem = ledger(device);
  const double mib = double(1 << 20), tp = topo->grid().tp;
  double predicted = 0;
  for (int v = 0; v < stage->chunk_count(); ++v)
    for (const auto& [name, p] : stage->chunk(v).named_parameters()) {
      const nn::ParamLayout layout = nn::layout_of(p);
      const double whole = 4.0 * double(layout.full_numel());
      predicted += layout.is_split() ? whole / tp : whole;
    }
  const dist::TensorParallelTraffic t = dist::tensor_parallel_traffic();
  std::printf(
      "tp memory, tp rank %d of %d (dp rank %d): params=%.3f grads=%.3f optimizer=%.3f activations=%.3f MiB "
      "(predicted params=%.3f MiB); tp traffic of step 1: all-reduce=%.3f all-gather=%.3f "
      "reduce-scatter=%.3f MiB\n",
      topo->coord().tp, topo->grid().tp, topo->coord().dp, double(mem.current(MemTag::kParams)) / mib,
      double(mem.current(MemTag::kGrads)) / mib, double(mem.current(MemTag::kOptimizer)) / mib,
      double(mem.peak(MemTag::kActivations)) / mib, predicted / mib, double(t.all_reduce_bytes) / mib,
      double(t.all_gather_bytes) / mib, double(t.reduce_scatter_bytes) / mib);
  std::fflush(stdout);
}

// The model configuration: from the flags, or from the checkpoint (flags given explicitly must agree with it).
nn::GPTConfig Trainer::State::model_config(int64_t vocab) const {
  nn::GPTConfig m{
      vocab, cfg.seq_or_default(), cfg.layers_or_default(), cfg.heads_or_default(), cfg.embd_or_default(), cfg.dropout,
      true,  cfg.vocab_pad};
  if (!ckpt) return m;
  const nn::GPTConfig& c = ckpt->config;
  auto agree = [&](const char* flag, const std::optional<int64_t>& given, int64_t stored) {
    MINIDL_CHECK(!given || *given == stored, flag, " ", *given, " does not match the checkpoint ", ckpt_source,
                 ", which has ", stored);
  };
  agree("--layers", cfg.layers, c.n_layer);
  agree("--heads", cfg.heads, c.n_head);
  agree("--embd", cfg.embd, c.n_embd);
  MINIDL_CHECK(!cfg.seq || *cfg.seq <= c.block_size, "--seq ", cfg.seq.value_or(0), " is longer than the checkpoint ",
               ckpt_source, "'s block size ", c.block_size);
  m = c;
  m.dropout = cfg.dropout;
  m.vocab_pad = cfg.vocab_pad;  // a layout choice, not stored in checkpoints
  return m;
}

// What every rank must agree on: everything that changes the data, the model, the numerics or the collectives.
std::vector<std::pair<std::string, std::string>> Trainer::State::config_fields() const {
  const TrainConfig& o = cfg;
  auto opt = [](const std::optional<int64_t>& v) { return v ? str(*v) : std::string("default"); };
  return {{"data", o.data + " (" + str(ds->train_tokens()) + " train tokens)"},
          {"tokenizer", ds->tokenizer().kind()},
          {"layers", opt(o.layers)},
          {"heads", opt(o.heads)},
          {"embd", opt(o.embd)},
          {"seq", opt(o.seq)},
          {"vocab_pad", str(o.vocab_pad)},
          {"batch", str(o.batch)},
          {"steps", str(o.steps)},
          {"lr", str(o.lr)},
          {"min_lr", str(o.min_lr.value_or(-1))},
          {"warmup", str(o.warmup)},
          {"weight_decay", str(o.weight_decay)},
          {"dropout", str(o.dropout)},
          {"grad_clip", str(o.grad_clip)},
          {"seed", str(o.seed)},
          {"init_from", o.init_from},
          {"backend", o.backend},
          {"dp", str(o.dp)},
          {"tp", str(o.tp)},
          {"pp", str(o.pp)},
          {"sequence_parallel", str(o.sequence_parallel)},
          {"zero", str(o.zero)},
          {"amp", o.amp},
          {"recompute", o.recompute},
          {"device", o.device},
          {"tf32", str(o.tf32)},
          {"advance_lr_on_skip", str(o.advance_lr_on_skip)},
          {"checkpoint_dir", o.checkpoint_dir},
          {"save_every", str(o.save_every)},
          {"micro_batches", opt(o.micro_batches)},
          {"schedule", o.schedule},
          {"virtual_stages", str(o.virtual_stages)},
          {"pp_layers", o.pp_layers}};
}

std::string Trainer::State::save_checkpoint(int64_t steps_done, int64_t schedule_step) const {
  const std::string dir = (std::filesystem::path(cfg.checkpoint_dir) / checkpoint_name(steps_done)).string();
  std::string what = dir;
  if (std::filesystem::exists(dir)) return what;  // every rank sees it (one shared directory): none writes
  const trace::Span span("checkpoint");
  auto t0 = std::chrono::steady_clock::now();
  // Every rank writes one optimizer file: rank (pp s, dp d, tp t) writes file (s·dp + d)·tp + t, AdamW's state of
  // its share of its stage's logical tensors (ZeRO: all-gathered bucket by bucket, tp: tensor by tensor); the
  // leader also writes the whole model (gathered into a one-process GPT). The two barriers together wait for every
  // rank: each dp group, then each replica.
  const dist::Grid& g = topo->grid();
  const dist::GridCoord me = topo->coord();
  CheckpointWriter writer{(me.pp * g.dp + me.dp) * g.tp + me.tp, g.pp * g.dp * g.tp, logger, [this] {
                            topo->dp_group().barrier()->wait();
                            topo->model_parallel_group().barrier()->wait();
                          }};
  sync->hold_full_parameters(true);
  const OptimizerCheckpoint opt = optimizer_state(*optimizer, *stage, *sync, checkpoint_share(*stage));
  const std::shared_ptr<const nn::GPT> whole = consolidated_model(*stage, logger);
  if (logger) std::filesystem::create_directories(cfg.checkpoint_dir);
  nlohmann::json run = nlohmann::json::object();
  for (const auto& [k, v] : config_fields()) run[k] = v;
  TrainingState st{steps_done, schedule_step, std::nullopt, run.dump()};
  if (scaler) st.scaler = scaler->state();
  train::save_checkpoint(dir, whole.get(), ds->tokenizer().to_json().dump(), opt, st, writer);
  if (logger) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    uint64_t bytes = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir)) bytes += std::filesystem::file_size(f.path());
    what += " (" + fmt("%.1f", double(bytes) / double(1 << 20)) + " MiB in " + fmt("%.0f", ms) + " ms)";
    if (cfg.keep_last > 0) prune_checkpoints(cfg.checkpoint_dir, cfg.keep_last);
  }
  sync->hold_full_parameters(false);
  writer.barrier();  // nobody goes on (or exits) before the checkpoint is complete
  return what;
}

void Trainer::State::print_header() const {
  if (!logger) return;
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  const nn::GPTConfig& c = stage->config();
  const dist::Grid& g = topo->grid();
  std::printf(
      "minidl train_gpt: %lld parameters, layers=%lld heads=%lld embd=%lld seq=%lld batch=%lld vocab=%lld "
      "threads=%d dp=%d tp=%d pp=%d zero=%d micro_batches=%d amp=%s recompute=%s device=%s data=%s "
      "(%zu train / %zu val tokens) tokenizer=%s\n",
      (long long)num_params, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)seq,
      (long long)cfg.batch, (long long)c.vocab_size, num_threads(), g.dp, g.tp, g.pp, cfg.zero,
      stage->spec().micro_batches, cfg.amp.c_str(), cfg.recompute.c_str(),
      device.is_cpu() ? "cpu" : (cfg.device + " (" + device_name(device) + ")").c_str(), cfg.data.c_str(),
      size_t(ds->train_tokens()), ds->val().size(), ds->tokenizer().kind());
  if (amp == DType::bf16) std::printf("amp bf16: no loss scaling needed (bf16 has f32's exponent range)\n");
  if (scaler)
    std::printf(
        "amp fp16: dynamic loss scaling from %g (x%g every %lld clean steps, x%g on overflow; the run stops "
        "after %lld consecutive skipped steps)\n",
        scaler->current_scale(), scaler->options().growth_factor, (long long)scaler->options().growth_interval,
        scaler->options().backoff_factor, (long long)cfg.max_skipped_steps);
  std::fflush(stdout);
}

Trainer::Trainer(const TrainConfig& config, const dist::Context& ctx) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = config;
  const TrainConfig& o = s.cfg;
  set_num_threads(o.threads > 0 ? o.threads : ctx.threads_per_rank());
  if (o.check_collectives) dist::set_checking_collectives(true);  // before the groups are made
  if (o.collective_timeout || !o.debug_dir.empty()) {             // the flags over the environment's watchdog options
    dist::WatchdogOptions w = dist::watchdog_options();
    if (o.collective_timeout) w.timeout_s = *o.collective_timeout;
    if (!o.debug_dir.empty()) w.debug_dir = o.debug_dir;
    dist::start_watchdog(w, ctx.rank());
  }

  const auto t0 = std::chrono::steady_clock::now();
  if (o.resume == "auto") {  // the newest checkpoint that verifies; damaged ones are skipped by name
    s.resume = latest_checkpoint(o.checkpoint_dir, [&](const std::string& m) { s.notes.push_back(m); });
    if (!s.resume) s.notes.push_back("no complete checkpoint in " + o.checkpoint_dir + " verifies: starting fresh");
  } else if (!o.resume.empty()) {
    s.resume = load_checkpoint(o.resume);  // verified: sizes, checksums, DONE
  }
  if (s.resume) {
    s.notes.push_back("resuming from " + s.resume->dir + " (read and verified in " + fmt("%.0f", ms_since(t0)) +
                      " ms)");
    s.ckpt_source = s.resume->dir;
    s.ckpt = nn::load_gpt((std::filesystem::path(s.resume->dir) / "model.safetensors").string());
  } else if (!o.init_from.empty()) {
    s.ckpt_source = o.init_from;
    s.ckpt = nn::load_gpt(o.init_from);
  }
  if (s.ckpt) {
    auto it = s.ckpt->metadata.find("vocab");
    MINIDL_CHECK(it != s.ckpt->metadata.end(), "--init-from ", s.ckpt_source,
                 ": the checkpoint has no \"vocab\" metadata");
    const data::Tokenizer saved = metadata_field(
        s.ckpt_source, s.ckpt->metadata, "vocab", "the tokenizer as JSON (save_gpt's)",
        [&](const std::string& t) { return data::Tokenizer::from_json(nlohmann::json::parse(t), o.gpt2_encoding); });
    MINIDL_CHECK(o.tokenizer.empty() || o.tokenizer == saved.kind(), "--tokenizer ", o.tokenizer, ": the checkpoint ",
                 s.ckpt_source, " was trained with the ", saved.kind(), " tokenizer");
    s.ds.emplace(open_dataset(o, &saved));
  } else {
    s.ds.emplace(open_dataset(o, nullptr));
  }
  if (!o.prompt.empty()) s.ds->tokenizer().encode(o.prompt);  // a prompt the tokens cannot spell: say so now
  if (ctx.world_size() > 1) dist::check_same_config(ctx, s.config_fields());
  s.seq = o.seq || !s.ckpt ? o.seq_or_default() : s.ckpt->config.block_size;
  MINIDL_CHECK(s.ds->train_tokens() >= s.seq + 1 && int64_t(s.ds->val().size()) >= s.seq + 1, "--data ", o.data,
               ": expected at least ", s.seq + 1, " tokens in each split for --seq ", s.seq, ", found ",
               s.ds->train_tokens(), " (train) and ", s.ds->val().size(), " (validation)");
  MINIDL_CHECK(s.ds->train_shards().empty() || !o.cuda_graph, "--cuda-graph with --data ", o.data, ": a graph draws ",
               "its batch on the device from a split held there, and token shards stream from disk");
  // Non-overlapping windows of seq + 1 tokens; asking for more than the split holds uses them all.
  s.windows = std::min<int64_t>(o.eval_windows, int64_t(s.ds->val().size()) / (s.seq + 1));
  nn::GPTConfig model_cfg = s.model_config(s.ds->tokenizer().size());

  s.device = select_device(o.device, ctx.local_rank());
  ops::set_allow_tf32(o.tf32);
  const std::string backend = !o.backend.empty() ? o.backend : s.device.is_cpu() ? "mpi" : "nccl";
  MINIDL_CHECK(s.device.is_cpu() ? backend != "nccl" : backend != "mpi", "--backend ", backend,
               " does not serve --device ", o.device, ": use ",
               s.device.is_cpu() ? "mpi or ring on the CPU" : "nccl or ring on CUDA devices");
  const dist::Grid grid{dp_size(o, ctx.world_size()), o.tp, o.pp};
  s.topo = std::make_unique<dist::Topology>(ctx.world(), grid, backend, s.device);
  const dist::GridCoord me = s.topo->coord();
  s.logger = me == dist::GridCoord{};
  if (!o.trace.empty()) {  // every rank's clock starts at about the same barrier, and is measured against rank 0's
    MINIDL_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    // MINIDL_TEST_TRACE_LATE_RANK=R:MS starts world rank R's clock this many ms late (the clock alignment's test).
    if (const char* late = std::getenv("MINIDL_TEST_TRACE_LATE_RANK"); late && std::atoi(late) == ctx.rank())
      if (const char* colon = std::strchr(late, ':'))
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(std::atof(colon + 1)));
    trace::name_thread("main");
    trace::start((std::filesystem::path(o.trace) / ("rank" + std::to_string(ctx.rank()) + ".json")).string(),
                 ctx.rank());
    const dist::ClockOffset clock = dist::clock_offset_to_rank0(ctx.world(), trace::now_us);
    trace::set_clock_offset(clock.offset_us, clock.uncertainty_us);
  }

  // Data parallelism: dp rank d takes samples [d * local, (d + 1) * local) of each global batch; its dropout masks
  // are those of the same samples in one process.
  s.local_batch = o.batch / grid.dp;
  s.first_sample = me.dp * s.local_batch;
  // This rank's stage and its GradSync (train/parallel_model.h); checkpoint weights go in before anything moves or
  // is sharded (each chunk takes its tensors of the whole model; at tp > 1 its slices).
  ParallelModel built = build_model_and_sync(o, model_cfg, *s.topo, s.device, s.first_sample, [&](Stage& stage) {
    if (s.resume)
      restore_model(*s.resume, stage);
    else if (s.ckpt)
      load_model(stage, o.init_from);
  });
  s.stage = std::move(built.stage);
  s.sync = std::move(built.sync);
  s.num_params = built.num_params;
  s.notes.insert(s.notes.end(), built.notes.begin(), built.notes.end());
  s.amp = amp_dtype(o.amp);
  if (s.amp == DType::f16) {
    optim::GradScalerOptions scaling;
    scaling.init_scale = o.loss_scale_init;
    scaling.growth_interval = o.loss_scale_growth_interval;
    s.scaler.emplace(scaling);
    auto it = s.ckpt ? s.ckpt->metadata.find("grad_scaler") : nn::Metadata::const_iterator{};
    if (s.resume && s.resume->state.scaler)
      s.scaler->load_state(*s.resume->state.scaler);
    else if (s.ckpt && it != s.ckpt->metadata.end())
      s.scaler->load_state(metadata_field(s.ckpt_source, s.ckpt->metadata, "grad_scaler",
                                          "a JSON object with scale, clean_steps, overflows_left and skipped_steps",
                                          scaler_state_from_json));
  }
  s.optimizer = std::make_unique<optim::AdamW>(
      s.sync->optimizer_groups(optim::decay_groups(s.stage->named_parameters(), o.weight_decay)),
      optim::AdamWOptions{o.lr});
  if (s.resume) {
    restore_optimizer(*s.resume, *s.stage, *s.sync, *s.optimizer);  // AdamW's m, v, step: this rank's part
    MINIDL_CHECK(s.resume->state.step <= o.steps, "--resume ", s.resume->dir, ": the checkpoint is at step ",
                 s.resume->state.step, ", past --steps ", o.steps);
    // The data sampler and the dropout masks are functions of (seed, step): the step is their whole position.
    s.stage->set_dropout(uint64_t(s.resume->state.step), s.first_sample);
  }
  if (!o.checkpoint_dir.empty()) install_preemption_handlers();
  s.print_header();
}

Trainer::~Trainer() = default;

namespace {

// Where a step's batch comes from: the split in memory, token shards streamed one at a time, or (on a device) drawn
// there from the split uploaded once, by the step itself when it is a captured CUDA graph.
class Batches {
 public:
  Batches(const data::TextDataset& ds, const Stage& stage, const TrainConfig& o, int64_t seq, int64_t first, int64_t n)
      : first_(first), n_(n) {
    if (!ds.train_shards().empty())
      streamed_.emplace(ds.train_shards(), seq, o.batch, o.seed, ds.tokenizer().size());
    else if (stage.device().is_cuda())
      on_device_.emplace(device_sampler(stage.chunk(0), ds.train(), seq, o.batch, o.seed));
    else
      in_memory_.emplace(ds.train(), seq, o.batch, o.seed);
  }
  // One step of `stage` on this rank's slice of step `step`'s global batch.
  StepResult step(Stage& stage, optim::AdamW& optimizer, int64_t step, StepOptions so) {
    if (graph_) return graph_->step(*on_device_, step, first_, n_, so.lr);
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<trace::Span> span(std::in_place, "data");
    const data::Batch b = on_device_   ? draw_checked(*on_device_, step, first_, n_, so)
                          : in_memory_ ? in_memory_->batch(step, first_, n_)
                                       : streamed_->batch(step, first_, n_);
    data_ms = ms_since(t0);
    span.reset();
    return train_step(stage, optimizer, b, so);
  }
  double data_ms = 0;  // the last step's time drawing its batch
  // --cuda-graph (one process on a device: validate): the step captured once and replayed.
  void capture(Stage& stage, optim::AdamW& optimizer, StepOptions so) {
    so.grad_sync = nullptr;  // one process: nothing to synchronise
    so.micro_batches = stage.spec().micro_batches;
    graph_ = std::make_unique<CudaGraphStep>(stage.chunk(0), optimizer, so);
  }

 private:
  int64_t first_, n_;
  std::optional<data::BatchSampler> in_memory_;
  std::optional<data::ShardSampler> streamed_;
  std::optional<data::DeviceBatchSampler> on_device_;  // declared before the graph, whose kernels read its buffers
  std::unique_ptr<CudaGraphStep> graph_;
};

// When the loop reads a step's numbers back. On a CUDA device a step's loss, norm and overflow flag stay there
// (StepResult::read) until the loop needs them: on the steps it prints, evaluates, saves or stops at and the
// summary's last 10; every step on the CPU, and every step with fp16 when the learning rate holds on skipped steps
// and is not constant (it needs each skip). Reading settles what the steps since the last read decided: the held
// schedule, the run of skipped steps (--max-skipped-steps), the divergence check.
class ReadBack {
 public:
  ReadBack(const TrainConfig& o, const optim::CosineSchedule& schedule, optim::GradScaler* scaler, Device device,
           dist::ProcessGroup& dp, int64_t schedule_step)
      : o_(o),
        scaler_(scaler),
        dp_(dp),
        holds_on_skip_(scaler && !o.advance_lr_on_skip),
        every_step_(!device.is_cuda() || (holds_on_skip_ && !(o.warmup == 0 && schedule.min_lr() == schedule.lr()))),
        schedule_step_(schedule_step),
        skipped_seen_(scaler ? scaler->skipped_steps() : 0) {}
  int64_t schedule_step() const { return schedule_step_; }
  bool every_step() const { return every_step_; }
  // After each step: the schedule advances now unless it holds on skipped steps (then settle() advances it).
  void stepped() {
    if (!holds_on_skip_) ++schedule_step_;
    ++unread_;
  }
  // Reads the last step's numbers. Collective over the dp group.
  void settle(StepResult& r, int64_t step) {
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

 private:
  const TrainConfig& o_;
  optim::GradScaler* scaler_;
  dist::ProcessGroup& dp_;
  const bool holds_on_skip_, every_step_;
  int64_t schedule_step_, skipped_seen_, unread_ = 0, in_a_row_ = 0;
};

// The step times the summary reports and the progress lines: the first step (caches and the allocator warming)
// is left out of the means; on a device the queue drains only when a step is read, so a printed line shows the
// mean over the steps since the last one.
class Meter {
 public:
  Meter(const TrainConfig& o, double flops_per_step, double tokens_per_step, double peak_tflops, bool device)
      : o_(o), flops_(flops_per_step), tokens_(tokens_per_step), peak_tflops_(peak_tflops), device_(device) {}
  void add(int64_t step, int64_t first_step, double ms, const dist::ReducerStats& comm, double loss) {
    if (!device_) window_ms_ = 0, window_steps_ = 0;  // the CPU's lines show their own step
    window_ms_ += ms;
    ++window_steps_;
    comm_ = comm;
    if (step > first_step || o_.steps == first_step + 1) {
      timed_ms_ += ms, compute_ms_ += ms - comm.exposed_comm_ms, comm_ms_ += comm.comm_ms;
      exposed_ms_ += comm.exposed_comm_ms, ++timed_;
    }
    if (step >= o_.steps - 10 && std::isfinite(loss)) recent_loss_ += loss, ++recent_;
  }
  // The progress line of step `step` (reads the scaler's state: on a device, a synchronisation).
  std::string line(int64_t step, double loss, double lr, const optim::GradScaler* scaler, bool data_parallel) {
    const double ms = shown_ms = device_ ? window_ms_ / double(window_steps_) : window_ms_;
    window_ms_ = 0, window_steps_ = 0;
    const double gflops = flops_ / ms / 1e6;
    std::string l = "step " + std::to_string(step + 1) + "/" + std::to_string(o_.steps) + " | loss " +
                    fmt("%.4f", loss) + " | lr " + fmt("%.2e", lr) + " | " + fmt("%.1f", ms) + " ms | " +
                    fmt("%.0f", tokens_ / ms * 1e3) + " tok/s | " + fmt("%.1f", gflops) + " GFLOP/s";
    if (peak_tflops_ > 0) l += " | MFU " + fmt("%.1f", 100 * gflops / (peak_tflops_ * 1e3)) + "%";
    l += " | peak " + fmt("%.0f", peak_rss_mb()) + " MB";
    if (scaler)
      l += " | scale " + fmt("%g", scaler->current_scale()) + " | skipped " + std::to_string(scaler->skipped_steps());
    if (data_parallel)
      l += " | comm " + fmt("%.1f", comm_.comm_ms) + " ms, exposed " + fmt("%.1f", comm_.exposed_comm_ms) + " ms";
    return l;
  }
  // The summary line (scripts parse it: docs/train_gpt.md documents each field).
  // The numbers of the last line shown, as TensorBoard scalars at `step` (1-based).
  void log(EventWriter& tb, int64_t step, const StepResult& r, double lr, const optim::GradScaler* scaler,
           Device device) const {
    tb.scalar("train/loss", r.loss, step);
    tb.scalar("lr", lr, step);
    tb.scalar("grad_norm", r.grad_norm, step);
    if (scaler)
      tb.scalar("loss_scale", scaler->current_scale(), step),
          tb.scalar("skipped_steps", double(scaler->skipped_steps()), step);
    tb.scalar("step_ms", shown_ms, step);
    tb.scalar("tokens_per_s", tokens_ / shown_ms * 1e3, step);
    if (peak_tflops_ > 0) tb.scalar("mfu", flops_ / shown_ms / 1e9 / peak_tflops_, step);
    tb.scalar("exposed_comm_ms", comm_.exposed_comm_ms, step);
    const MemoryLedger& mem = ledger(device);
    for (auto [tag, name] : {std::pair{MemTag::kParams, "params"},
                             {MemTag::kGrads, "grads"},
                             {MemTag::kOptimizer, "optimizer"},
                             {MemTag::kActivations, "activations"}})
      tb.scalar(std::string("memory_mb/") + name, double(mem.peak(tag)) / double(1 << 20), step);
  }
  double shown_ms = 0;

  void print_summary(double val_loss, const optim::GradScaler* scaler, Device device) const {
    auto per_step = [&](double total) { return timed_ ? total / double(timed_) : 0.0; };
    const double ms = per_step(timed_ms_), gflops = ms > 0 ? flops_ / ms / 1e6 : 0.0;
    const MemoryLedger& mem = ledger(device);  // the training device's ledger (the GPU's, with --device cuda)
    auto mb = [&](MemTag tag) { return double(mem.peak(tag)) / double(1 << 20); };
    std::printf(
        "summary: steps=%lld train_loss=%.9g val_loss=%.9g ms_per_step=%.2f tokens_per_s=%.0f gflops=%.2f "
        "peak_mem_mb=%.1f compute_ms=%.2f comm_ms=%.3f exposed_comm_ms=%.3f loss_scale=%g skipped_steps=%lld "
        "act_peak_mb=%.2f param_mb=%.2f grad_mb=%.2f optim_mb=%.2f mfu=%.4f\n",
        (long long)o_.steps, recent_ ? recent_loss_ / double(recent_) : NAN, val_loss, ms,
        ms > 0 ? tokens_ / ms * 1e3 : 0.0, gflops, peak_rss_mb(), per_step(compute_ms_), per_step(comm_ms_),
        per_step(exposed_ms_), scaler ? scaler->current_scale() : 1.0,
        (long long)(scaler ? scaler->skipped_steps() : 0), mb(MemTag::kActivations), mb(MemTag::kParams),
        mb(MemTag::kGrads), mb(MemTag::kOptimizer), peak_tflops_ > 0 ? gflops / (peak_tflops_ * 1e3) : NAN);
    std::fflush(stdout);
  }

 private:
  const TrainConfig& o_;
  const double flops_, tokens_, peak_tflops_;
  const bool device_;
  dist::ReducerStats comm_;
  double window_ms_ = 0, timed_ms_ = 0, compute_ms_ = 0, comm_ms_ = 0, exposed_ms_ = 0, recent_loss_ = 0;
  int64_t window_steps_ = 0, timed_ = 0, recent_ = 0;
};

}  // namespace

// Every --log-every steps at more than one rank: every rank's step, data, compute and exposed-communication times
// gathered, and the logging rank prints the slowest and the fastest rank of each with their ranks, flagging a rank
// whose compute (the step less its exposed communication: the others wait for it there) took more than 1.2x the
// median's (the lower median: at 2 ranks, the faster one). Collective over the world.
void report_stragglers(ProgressLine& progress, bool logger, int64_t step, const std::array<double, 4>& mine) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<double> all(4 * size_t(world));
  MINIDL_MPI_CHECK(MPI_Allgather(mine.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, MPI_COMM_WORLD));
  if (!logger) return;
  auto at = [&](int r, int k) { return all[4 * size_t(r) + size_t(k)]; };
  std::string line = "step " + std::to_string(step + 1) + " per rank (slowest / fastest):";
  const char* names[] = {"step", "data", "compute", "exposed comm"};
  for (int k = 0; k < 4; ++k) {
    int slow = 0, fast = 0;
    for (int r = 1; r < world; ++r) {
      if (at(r, k) > at(slow, k)) slow = r;
      if (at(r, k) < at(fast, k)) fast = r;
    }
    line += std::string(k ? ";" : "") + " " + names[k] + " " + fmt("%.2f", at(slow, k)) + " ms (rank " +
            std::to_string(slow) + ") / " + fmt("%.2f", at(fast, k)) + " ms (rank " + std::to_string(fast) + ")";
  }
  std::vector<double> compute(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) compute[size_t(r)] = at(r, 2);
  std::vector<double> sorted = compute;
  std::nth_element(sorted.begin(), sorted.begin() + (world - 1) / 2, sorted.end());
  const double median = sorted[size_t((world - 1) / 2)];
  for (int r = 0; r < world; ++r)
    if (compute[size_t(r)] > 1.2 * median)
      line += "; rank " + std::to_string(r) + " is a straggler (compute " + fmt("%.2f", compute[size_t(r)] / median) +
              "x the median)";
  progress.print(line);
}

// The CPU's peak for MFU: the sgemm ceiling at the step's own product shapes (ops/sgemm_ceiling.h: every product of
// a micro-batch once, on one thread, times this rank's threads), one round measured before the first step, summed
// over the ranks (the whole model's shapes: a tensor-parallel rank's are smaller, so its MFU is approximate).
double Trainer::State::cpu_ceiling_tflops() const {
  const nn::GPTConfig& c = stage->config();
  const int64_t rows = local_batch / stage->spec().micro_batches * seq;
  const double gflops = ops::SgemmCeiling({c.n_layer, c.n_embd, c.vocab_size, rows}).measure(num_threads());
  return sum_over(topo->model_parallel_group(), sum_over(topo->dp_group(), gflops)) / 1e3;
}

// --trace's memory track: the ledger's bytes by tag after each step.
void trace_memory(Device device) {
  if (!trace::enabled()) return;
  const MemoryLedger& mem = ledger(device);
  auto mib = [&](MemTag t) { return double(mem.current(t)) / double(1 << 20); };
  trace::counter("memory MiB", {{"params", mib(MemTag::kParams)},
                                {"grads", mib(MemTag::kGrads)},
                                {"optimizer", mib(MemTag::kOptimizer)},
                                {"activations peak", double(mem.peak(MemTag::kActivations)) / double(1 << 20)}});
}

double Trainer::State::evaluate(const data::Batch& val) const {
  const trace::Span span("evaluate");
  sync->hold_full_parameters(true);  // ZeRO-3: the ranks evaluate different batches
  const double v = train::evaluate(*stage, val, cfg.batch, &topo->dp_group());  // collective
  sync->hold_full_parameters(false);
  return v;
}

int Trainer::run() {
  State& s = *s_;
  const TrainConfig& o = s.cfg;
  const optim::CosineSchedule schedule(o.lr, o.min_lr.value_or(o.lr), o.warmup, std::max<int64_t>(o.steps, 1));
  const data::Batch val = data::eval_windows(s.ds->val(), s.seq, s.windows);
  Batches batches(*s.ds, *s.stage, o, s.seq, s.first_sample, s.local_batch);
  StepOptions so{.grad_clip = o.grad_clip,
                 .amp = s.amp,
                 .scaler = s.scaler ? &*s.scaler : nullptr,
                 .grad_sync = s.sync.get(),
                 .read_back = false};
  if (o.cuda_graph) batches.capture(*s.stage, *s.optimizer, so);
  const int64_t first_step = s.resume ? s.resume->state.step : 0;
  ReadBack reads(o, schedule, so.scaler, s.device, s.topo->dp_group(), s.resume ? s.resume->state.schedule_step : 0);
  // MFU: achieved FLOP/s over --peak-tflops, else the GPU's dense peak for the dtype the products run in (GPUs in
  // the table), else the CPU's sgemm ceiling at the step's shapes. A GPU the table lacks gets no MFU, and says so.
  const double peak_tflops = o.peak_tflops > 0    ? o.peak_tflops
                             : s.device.is_cuda() ? gpu_peak_tflops(device_name(s.device), s.amp, o.tf32)
                                                  : s.cpu_ceiling_tflops();
  if (peak_tflops <= 0 && s.logger)
    std::printf("MFU: no dense peak known for '%s' (train/device.cpp's table); pass --peak-tflops for one\n",
                device_name(s.device).c_str());
  Meter meter(o, s.stage->flops_per_token(s.seq) * double(o.batch * s.seq), double(o.batch * s.seq), peak_tflops,
              s.device.is_cuda());
  ProgressLine progress(parse_progress_mode(o.progress), o.log_every, s.logger);
  std::unique_ptr<EventWriter> tb;  // --tensorboard, on the logging rank
  if (s.logger && !o.tensorboard.empty()) tb = std::make_unique<EventWriter>(o.tensorboard);
  // MINIDL_TEST_SLOW_RANK=R:MS makes world rank R this many ms slower a step (the straggler report's test).
  double slow_ms = 0;
  if (const char* slow = std::getenv("MINIDL_TEST_SLOW_RANK"); slow && std::atoi(slow) == s.topo->rank())
    if (const char* colon = std::strchr(slow, ':')) slow_ms = std::atof(colon + 1);
  for (int64_t step = first_step; step < o.steps; ++step) {
    const double lr = schedule(reads.schedule_step());
    const auto t0 = std::chrono::steady_clock::now();
    if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow_ms));
    if (step == first_step && o.tp > 1) dist::reset_tensor_parallel_traffic();
    so.lr = lr;
    std::optional<trace::Span> span(std::in_place, trace::enabled() ? "step " + std::to_string(step + 1) : "");
    StepResult r = batches.step(*s.stage, *s.optimizer, step, so);
    span.reset();
    trace_memory(s.device);
    reads.stepped();
    if (step == first_step) {  // the first step's proofs by ledger; the bubble timed from the second step on
      if (o.tp > 1) s.print_tensor_parallel_step();
      if ((o.zero > 0 || o.memory_report) && o.pp == 1) s.print_zero_memory();
      if (o.steps > first_step + 1) s.stage->reset_timing();
    }
    const bool last = step + 1 == o.steps, evaluates = o.eval_every > 0 && (step + 1) % o.eval_every == 0 && !last;
    const bool shows = progress.shows(step + 1, o.steps);
    double ms = ms_since(t0);
    const dist::ReducerStats comm = s.sync->comm_stats();
    if (reads.every_step() || evaluates || shows || step >= o.steps - 10) {
      reads.settle(r, step);
      if (s.device.is_cuda()) ms = ms_since(t0);  // the read drained the device's queue
    }
    meter.add(step, first_step, ms, comm, r.loss);
    if (s.topo->grid().size() > 1 && (step + 1) % o.log_every == 0)
      report_stragglers(progress, s.logger, step,
                        {ms, batches.data_ms, ms - comm.exposed_comm_ms, comm.exposed_comm_ms});
    if (shows) progress.update(step + 1, o.steps, meter.line(step, r.loss, lr, so.scaler, s.topo->grid().dp > 1));
    if (shows && tb) meter.log(*tb, step + 1, r, lr, so.scaler, s.device);
    if (evaluates) {
      const double v = s.evaluate(val);
      progress.print("step " + std::to_string(step + 1) + ": val_loss " + fmt("%.4f", v));
      if (tb) tb->scalar("val/loss", v, step + 1);
    }
    if (o.checkpoint_dir.empty()) continue;
    // A stop asked of any rank (SIGTERM/SIGUSR1) stops every rank after this step, with a checkpoint.
    const bool stop =
        max_over(s.topo->model_parallel_group(), max_over(s.topo->dp_group(), preemption_requested() ? 1.0 : 0.0)) > 0;
    if (stop || (o.save_every > 0 && (step + 1) % o.save_every == 0 && !last)) {
      reads.settle(r, step);  // the schedule step and the scaler's state a checkpoint saves
      progress.print((stop ? "preempted: saved " : "saved ") + s.save_checkpoint(step + 1, reads.schedule_step()));
    }
    if (stop) return progress.finish(), trace::finish(), 0;
  }
  progress.finish();
  const double val_loss = s.finish(val, reads.schedule_step());
  if (tb) tb->scalar("val/loss", val_loss, o.steps);
  const std::string traced = trace::finish();
  if (s.logger && !traced.empty()) std::printf("trace: %s (and every rank's beside it)\n", traced.c_str());
  if (s.logger) meter.print_summary(val_loss, so.scaler, s.device);
  return 0;
}

double Trainer::State::finish(const data::Batch& val, int64_t schedule_step) const {
  const TrainConfig& o = cfg;
  if (!o.checkpoint_dir.empty() && o.save_every > 0 && o.steps > (resume ? resume->state.step : 0)) {
    const std::string dir = save_checkpoint(o.steps, schedule_step);
    if (logger) std::printf("saved %s\n", dir.c_str());
  }
  sync->hold_full_parameters(true);  // ZeRO-3: the whole model for evaluation, saving and sampling
  const double val_loss = train::evaluate(*stage, val, o.batch, &topo->dp_group());
  if (logger)
    std::printf("validation: %.4f over %lld windows of %lld tokens\n", val_loss, (long long)windows, (long long)seq);
  // The whole model as one process holds it (gathered over tp and from every stage; collective) on the logging
  // rank, which writes it (temporary name, then rename) and samples from it alone.
  std::shared_ptr<nn::GPT> whole;
  if (!o.save.empty() || o.sample > 0) whole = consolidated_model(*stage, logger);
  if (!o.save.empty() && logger) {
    nn::Metadata extras{{"steps", std::to_string(o.steps)}, {"val_loss", fmt("%.6f", val_loss)}};
    if (scaler) extras["grad_scaler"] = scaler_state_json(scaler->state());
    nn::save_gpt(o.save, *whole, ds->tokenizer().to_json().dump(), extras);
    std::printf("saved %s\n", o.save.c_str());
  }
  if (o.sample > 0 && logger) {
    // The prompt's tokens, or a fresh paragraph: a newline (characters), <|endoftext|> (GPT-2).
    const std::vector<int32_t> prompt =
        o.prompt.empty() ? std::vector<int32_t>{ds->tokenizer().sample_start()} : ds->tokenizer().encode(o.prompt);
    const GenerateOptions g{.max_new_tokens = o.sample,
                            .temperature = o.temperature,
                            .top_k = o.top_k,
                            .seed = o.seed,
                            .kv_cache = o.kv_cache};
    const std::vector<int32_t> out = train::generate(*whole, prompt, g);
    std::printf("---- sample ----\n%s\n----------------\n", ds->tokenizer().decode(out).c_str());
  }
  if (o.pp > 1) print_pipeline_report();
  return val_loss;
}

// Every stage's activation peak (the logger's ledger has only the first stage's): 1F1B keeps about min(M, pp - s)
// micro-batches on stage s, GPipe all M (dist/pipeline.h). And the measured bubble: each stage's time blocked on a
// peer over its schedule's time (timed steps). Collective over the pp group.
void Trainer::State::print_pipeline_report() const {
  dist::ProcessGroup& pp = topo->pp_group();
  const int64_t n = pp.size();
  std::vector<double> per_stage(size_t(2 * n), 0.0);
  per_stage[size_t(pp.rank())] = double(ledger(device).peak(MemTag::kActivations)) / double(1 << 20);
  const Stage::Timing& t = stage->timing();
  per_stage[size_t(n + pp.rank())] = t.schedule_ms > 0 ? t.wait_ms / t.schedule_ms : 0.0;
  Tensor all = Tensor::from_vector(per_stage, {2 * n}, DType::f64).to(pp.device());
  pp.all_reduce(all, dist::ReduceOp::kSum)->wait();
  const std::vector<double> v = all.to_vector();
  std::string peaks = "pipeline activation peak per stage (MiB):", waits = "pipeline measured bubble per stage (%):";
  double mean_wait = 0;
  for (int64_t i = 0; i < n; ++i) {
    peaks += fmt(" %.3f", v[size_t(i)]);
    waits += fmt(" %.1f", 100 * v[size_t(n + i)]);
    mean_wait += v[size_t(n + i)] / double(n);
  }
  if (logger)
    std::printf("%s\n%s; mean %.1f%% (time blocked on a peer / schedule time, over %lld step(s))\n", peaks.c_str(),
                waits.c_str(), 100 * mean_wait, (long long)t.steps);
}

}  // namespace minidl::train
