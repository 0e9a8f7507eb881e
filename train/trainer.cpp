#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/parallel.h"
#include "core/trace.h"
#include "dist/clock_sync.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "dist/local_sgd.h"
#include "dist/tensor_parallel.h"
#include "dist/topology.h"
#include "nn/atomic_file.h"
#include "nn/checkpoint.h"
#include "ops/matmul.h"
#include "optim/schedule.h"
#include "train/batches.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/grad_sync.h"
#include "train/parallel_model.h"
#include "train/read_back.h"
#include "train/report.h"
#include "train/step.h"
#include "train/test_hook.h"

namespace minidl::train {

namespace {

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

// This rank's place inside its replica (the grid's rank with the replica coordinate 0): which optimizer file and
// which DiLoCo state file it writes and reads.
int replica_rank(const dist::Topology& topo) {
  dist::GridCoord c = topo.coord();
  c.replica = 0;
  return topo.grid().rank_of(c);
}

}  // namespace

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
  std::unique_ptr<dist::OuterSync> outer;  // --sync local-sgd | diloco: across the replicas (dist/local_sgd.h)

  void print_header() const;
  // Collective: checkpoint_dir/step-N, every rank writing its share, the logger the rest; every rank waits for it.
  // Returns the directory, with its size and the time the write took on the logger.
  std::string save_checkpoint(int64_t steps_done, int64_t schedule_step) const;
  // Collective: the validation loss (ZeRO-3: the parameters held whole meanwhile, the ranks evaluating different
  // batches).
  double evaluate(const data::Batch& val) const;
  // Collective: the run's end after the last step (its checkpoint, the validation loss, --save, the sample, the
  // pipeline's per-stage report); returns the validation loss.
  double finish(const data::Batch& val, int64_t schedule_step) const;
  void after_first_step(int64_t first_step) const;
  // After each step; returns whether the run stops here (preempted: a checkpoint saved).
  bool checkpoint_after(int64_t step, StepResult& r, ReadBack& reads, Report& report) const;
};

std::string Trainer::State::save_checkpoint(int64_t steps_done, int64_t schedule_step) const {
  const std::string dir = (std::filesystem::path(cfg.checkpoint_dir) / checkpoint_name(steps_done)).string();
  std::string what = dir;
  if (std::filesystem::exists(dir)) return what;  // every rank sees it (one shared directory): none writes
  const trace::Span span("checkpoint");
  auto t0 = std::chrono::steady_clock::now();
  // Every rank writes one optimizer file: rank (pp s, dp d, tp t) of a replica writes file (s·dp + d)·tp + t, AdamW's
  // state of its share of its stage's logical tensors (ZeRO: all-gathered bucket by bucket, tp: tensor by tensor);
  // each replica's rank (0, 0, 0) also writes the whole model (gathered into a one-process GPT). The two barriers
  // together wait for every rank of a replica: each dp group, then the replica; the replica group's, for every rank.
  const dist::Grid& g = topo->grid();
  const dist::GridCoord me = topo->coord();
  const std::function<void()> replica_barrier = [this] {
    topo->dp_group().barrier()->wait();
    topo->model_parallel_group().barrier()->wait();
  };
  const int index = replica_rank(*topo);
  CheckpointWriter writer{index, g.size() / g.replicas, index == 0, replica_barrier};
  const bool replica_leader = writer.leader;
  sync->hold_full_parameters(true);
  const OptimizerCheckpoint opt = optimizer_state(*optimizer, *stage, *sync, checkpoint_share(*stage));
  const std::shared_ptr<const nn::GPT> whole = consolidated_model(*stage, replica_leader);
  if (logger) std::filesystem::create_directories(cfg.checkpoint_dir);
  nlohmann::json run = nlohmann::json::object();
  for (const auto& [k, v] : agreed_fields(cfg, *ds)) run[k] = v;
  TrainingState st{steps_done, schedule_step, std::nullopt, run.dump()};
  if (scaler) st.scaler = scaler->state();
  if (g.replicas == 1) {
    train::save_checkpoint(dir, whole.get(), ds->tokenizer().to_json().dump(), opt, st, writer);
  } else {  // each replica's own checkpoint, and DiLoCo's θ_global and momentum
    const OuterCheckpoint state{outer->global(), outer->momentum()};
    train::save_replicated_checkpoint(dir, me.replica, g.replicas, whole.get(), ds->tokenizer().to_json().dump(), opt,
                                      st, writer, &state, index, logger, [&] {
                                        replica_barrier();
                                        topo->replica_group().barrier()->wait();
                                      });
  }
  if (logger) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    uint64_t bytes = 0;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
      if (f.is_regular_file()) bytes += f.file_size();
    what += " (" + fmt("%.1f", double(bytes) / double(1 << 20)) + " MiB in " + fmt("%.0f", ms) + " ms)";
    if (cfg.keep_last > 0) prune_checkpoints(cfg.checkpoint_dir, cfg.keep_last);
  }
  sync->hold_full_parameters(false);
  writer.barrier();  // nobody goes on (or exits) before the checkpoint is complete
  if (g.replicas > 1) topo->replica_group().barrier()->wait();
  return what;
}

void Trainer::State::print_header() const {
  if (!logger) return;
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  const nn::GPTConfig& c = stage->config();
  const dist::Grid& g = topo->grid();
  std::printf(
      "minidl train_gpt: %lld parameters, layers=%lld heads=%lld embd=%lld seq=%lld batch=%lld vocab=%lld "
      "threads=%d dp=%d%s tp=%d pp=%d%s zero=%d micro_batches=%d amp=%s recompute=%s device=%s data=%s "
      "(%zu train / %zu val tokens) tokenizer=%s\n",
      (long long)num_params, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)seq,
      (long long)cfg.batch, (long long)c.vocab_size, num_threads(), g.dp,
      g.cp > 1 ? (" cp=" + std::to_string(g.cp)).c_str() : "", g.tp, g.pp,
      g.replicas > 1 || cfg.sync != "ddp" ? (" sync=" + cfg.sync + " every=" + std::to_string(cfg.sync_every) +
                                             " replicas=" + std::to_string(g.replicas))
                                                .c_str()
                                          : "",
      cfg.zero, stage->spec().micro_batches, cfg.amp.c_str(), cfg.recompute.c_str(),
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
  const int replica = ctx.rank() / (ctx.world_size() / o.replica_groups);  // the grid's outermost axis
  if (o.resume == "auto") {  // the newest checkpoint that verifies; damaged ones are skipped by name
    s.resume = latest_checkpoint(
        o.checkpoint_dir, [&](const std::string& m) { s.notes.push_back(m); }, replica);
    if (!s.resume) s.notes.push_back("no complete checkpoint in " + o.checkpoint_dir + " verifies: starting fresh");
  } else if (!o.resume.empty()) {
    s.resume = load_checkpoint(o.resume, replica);  // verified: sizes, checksums, DONE
  }
  if (s.resume) {
    MINIDL_CHECK(s.resume->replicas == 1 || s.resume->replicas == o.replica_groups, "--resume ", s.resume->run_dir,
                 ": it holds the states of ", s.resume->replicas, " replicas (--replica-groups ", s.resume->replicas,
                 "), this run has --replica-groups ", o.replica_groups, " (--init-from ", s.resume->dir,
                 "/model.safetensors starts a new run from one of them)");
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
    MINIDL_CHECK(o.tokenizer.empty() || data::Tokenizer::kind_of(o.tokenizer) == saved.kind(), "--tokenizer ",
                 o.tokenizer, ": the checkpoint ", s.ckpt_source, " was trained with the ", saved.kind(), " tokenizer");
    s.ds.emplace(open_dataset(o, &saved));
  } else {
    s.ds.emplace(open_dataset(o, nullptr));
  }
  if (!o.prompt.empty()) s.ds->tokenizer().encode(o.prompt);  // a prompt the tokens cannot spell: say so now
  if (ctx.world_size() > 1) dist::check_same_config(ctx, agreed_fields(o, *s.ds));
  s.seq = o.seq || !s.ckpt ? o.seq_or_default() : s.ckpt->config.block_size;
  MINIDL_CHECK(s.ds->train_tokens() >= s.seq + 1 && int64_t(s.ds->val().size()) >= s.seq + 1, "--data ", o.data,
               ": expected at least ", s.seq + 1, " tokens in each split for --seq ", s.seq, ", found ",
               s.ds->train_tokens(), " (train) and ", s.ds->val().size(), " (validation)");
  MINIDL_CHECK(s.ds->train_shards().empty() || !o.cuda_graph, "--cuda-graph with --data ", o.data, ": a graph draws ",
               "its batch on the device from a split held there, and token shards stream from disk");
  // Non-overlapping windows of seq + 1 tokens; asking for more than the split holds uses them all.
  s.windows = std::min<int64_t>(o.eval_windows, int64_t(s.ds->val().size()) / (s.seq + 1));
  nn::GPTConfig model_cfg =
      model_config(o, s.ds->tokenizer().size(), s.ckpt ? &s.ckpt->config : nullptr, s.ckpt_source);

  s.device = select_device(o.device, ctx.local_rank());
  ops::set_allow_tf32(o.tf32);
  const std::string backend = !o.backend.empty() ? o.backend : s.device.is_cpu() ? "mpi" : "nccl";
  MINIDL_CHECK(s.device.is_cpu() ? backend != "nccl" : backend != "mpi", "--backend ", backend,
               " does not serve --device ", o.device, ": use ",
               s.device.is_cpu() ? "mpi or ring on the CPU" : "nccl or ring on CUDA devices");
  const dist::Grid grid{
      .dp = dp_size(o, ctx.world_size()), .tp = o.tp, .pp = o.pp, .replicas = o.replica_groups, .cp = o.cp, .ep = o.ep};
  s.topo = std::make_unique<dist::Topology>(ctx.world(), grid, backend, s.device);
  const dist::GridCoord me = s.topo->coord();
  s.logger = me == dist::GridCoord{};
  if (!o.trace.empty()) {  // every rank's clock starts at about the same barrier, and is measured against rank 0's
    s.topo->dp_group().barrier()->wait();  // the two barriers together wait for every rank
    s.topo->model_parallel_group().barrier()->wait();
    test_hook(TestHook::kTraceStart, ctx.rank());
    trace::name_thread("main");
    trace::start((std::filesystem::path(o.trace) / ("rank" + std::to_string(ctx.rank()) + ".json")).string(),
                 ctx.rank());
    const dist::ClockOffset clock = dist::clock_offset_to_rank0(ctx.world(), trace::now_us);
    trace::set_clock_offset(clock.offset_us, clock.uncertainty_us);
  }

  // Data parallelism: dp rank d takes samples [d * local, (d + 1) * local) of each global batch; its dropout masks
  // are those of the same samples in one process. Replicas split the global batch as an outer dp axis would, so
  // local SGD at --sync-every 1 sees the batches DDP over all of them would.
  s.local_batch = o.batch / (grid.dp * grid.replicas);
  s.first_sample = (me.replica * grid.dp + me.dp) * s.local_batch;
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
  if (o.sync != "ddp") {
    const dist::OuterOptions outer{dist::outer_kind(o.sync), o.sync_every, o.outer_lr,
                                   o.outer_momentum,         o.nesterov,   dist::compression(o.outer_comm_hook)};
    if (s.resume && s.resume->replicas > 1) {  // each replica where it stopped, inside a window or at its end
      OuterCheckpoint st;
      if (outer.kind == dist::OuterKind::kDiLoCo)
        st = load_outer_state(*s.resume, replica_rank(*s.topo), grid.size() / grid.replicas);
      s.outer = std::make_unique<dist::OuterSync>(s.stage->parameters(), s.topo->replica_group(), outer,
                                                  std::move(st.global), std::move(st.momentum));
    } else {  // after any checkpoint is read: every replica starts from replica 0's parameters
      s.outer = std::make_unique<dist::OuterSync>(s.stage->parameters(), s.topo->replica_group(), outer);
    }
  }
  if (!o.checkpoint_dir.empty()) install_preemption_handlers();
  s.print_header();
}

Trainer::~Trainer() = default;

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
  const int64_t rows = s.local_batch / s.stage->spec().micro_batches * s.seq, tokens = o.batch * s.seq;
  Report report(o, *s.topo, s.device, s.logger,
                {s.stage->flops_per_token(s.seq) * double(tokens), double(tokens),
                 mfu_peak_tflops(o, *s.stage, *s.topo, s.device, s.amp, rows, s.logger)});
  const std::pair<int, int> delay = o.injected_delay();  // --inject-delay: a straggler on demand
  for (int64_t step = first_step; step < o.steps; ++step) {
    so.lr = schedule(reads.schedule_step());
    const auto t0 = std::chrono::steady_clock::now();
    test_hook(TestHook::kStepStart, s.topo->rank());
    if (delay.first == s.topo->rank()) std::this_thread::sleep_for(std::chrono::milliseconds(delay.second));
    if (step == first_step && o.tp > 1) dist::reset_tensor_parallel_traffic();
    std::optional<trace::Span> span(std::in_place, trace::enabled() ? "step " + std::to_string(step + 1) : "");
    StepResult r = batches.step(*s.stage, *s.optimizer, step, so);
    if (s.outer) s.outer->after_step(step + 1);
    span.reset();
    trace_memory(s.device);
    reads.stepped();
    if (step == first_step) s.after_first_step(first_step);
    const bool evaluates = o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps;
    double ms = ms_since(t0);
    const dist::ReducerStats comm = s.sync->comm_stats();
    if (reads.every_step() || evaluates || report.shows(step) || step >= o.steps - 10) {
      reads.settle(r, step);
      if (s.device.is_cuda()) ms = ms_since(t0);  // the read drained the device's queue
    }
    report.stepped(step, first_step, ms, batches.data_ms, comm, r, so.lr, so.scaler);
    if (evaluates) report.validation(step + 1, s.evaluate(val));
    if (s.checkpoint_after(step, r, reads, report)) return report.end(std::nullopt, so.scaler), 0;  // preempted
  }
  if (s.outer) {
    s.outer->finish(o.steps);
    const dist::OuterStats& st = s.outer->stats();
    char line[200];
    std::snprintf(line, sizeof line,
                  "outer sync: %s every %lld steps over %d replicas: %lld syncs of %.2f MiB, %.1f ms",
                  dist::outer_kind_name(s.outer->options().kind), (long long)o.sync_every, o.replica_groups,
                  (long long)st.syncs, st.syncs ? double(st.bytes) / double(st.syncs) / double(1 << 20) : 0.0, st.ms);
    report.print(line);
  }
  report.end_progress();
  report.end(s.finish(val, reads.schedule_step()), so.scaler);
  return 0;
}

// The first step's proofs by ledger; the pipeline's bubble is timed from the second step on.
void Trainer::State::after_first_step(int64_t first_step) const {
  if (cfg.tp > 1) print_tensor_parallel_step(*stage, *topo, device);
  if ((cfg.zero > 0 || cfg.memory_report) && cfg.pp == 1)
    print_zero_memory(cfg, *stage, *topo, device, amp, local_batch / stage->spec().micro_batches, seq);
  if (cfg.steps > first_step + 1) stage->reset_timing();
}

// With a checkpoint_dir: a stop asked of any rank (SIGTERM/SIGUSR1) stops every rank after this step, with a
// checkpoint; so does every save_every-th step but the last (finish saves that one). Returns whether to stop.
bool Trainer::State::checkpoint_after(int64_t step, StepResult& r, ReadBack& reads, Report& report) const {
  if (cfg.checkpoint_dir.empty()) return false;
  const double asked = max_over(topo->dp_group(), preemption_requested() ? 1.0 : 0.0);
  const bool stop = max_over(topo->replica_group(), max_over(topo->model_parallel_group(), asked)) > 0;
  if (stop || (cfg.save_every > 0 && (step + 1) % cfg.save_every == 0 && step + 1 < cfg.steps)) {
    reads.settle(r, step);  // the schedule step and the scaler's state a checkpoint saves
    report.print((stop ? "preempted: saved " : "saved ") + save_checkpoint(step + 1, reads.schedule_step()));
  }
  return stop;
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
    if (const std::string* file = ds->tokenizer().hf_json())  // beside the weights, for transformers' AutoTokenizer
      nn::write_text_file_atomically((std::filesystem::path(o.save).parent_path() / "tokenizer.json").string(), *file);
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
  if (o.pp > 1) print_pipeline_report(*stage, *topo, device, logger);
  return val_loss;
}

}  // namespace minidl::train
