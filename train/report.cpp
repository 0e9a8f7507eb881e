#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/parallel.h"
#include "core/trace.h"
#include "dist/tensor_parallel.h"
#include "nn/atomic_file.h"
#include "nn/param_layout.h"
#include "ops/sgemm_ceiling.h"
#include "train/device.h"
#include "train/grad_sync.h"
#include "train/zero_memory.h"

namespace minidl::train {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

namespace {

constexpr double kMiB = double(1 << 20);

// Every rank's `mine`, in world-rank order: gathered over the model-parallel group, then over dp (the two together
// span a replica), then over the replicas (and the watchdog and --check-collectives see every call).
std::vector<double> gather_every_rank(const dist::Topology& topo, const std::array<double, 4>& mine) {
  dist::ProcessGroup &mp = topo.model_parallel_group(), &dp = topo.dp_group();
  const Tensor in = Tensor::from_vector(std::vector<double>(mine.begin(), mine.end()), {4}, DType::f64);
  Tensor replica = Tensor::empty({4 * int64_t(mp.size())}, DType::f64, mp.device());
  mp.all_gather(replica, in.to(mp.device()))->wait();
  Tensor everyone = Tensor::empty({replica.numel() * dp.size()}, DType::f64, dp.device());
  dp.all_gather(everyone, replica)->wait();
  // [dp group rank = dp · cp + cp rank][model-parallel rank = pp · tp + tp rank][4]
  const std::vector<double> v = everyone.to_vector();
  const dist::Grid& g = topo.grid();
  std::vector<double> all(v.size());
  for (int d = 0; d < dp.size(); ++d)
    for (int j = 0; j < mp.size(); ++j)
      std::copy_n(v.begin() + 4 * (d * mp.size() + j), 4,
                  all.begin() + 4 * g.rank_of({.dp = d / g.cp, .tp = j % g.tp, .pp = j / g.tp, .cp = d % g.cp}));
  // Every replica's (a host group, replica r's ranks after replica r - 1's: the world's order).
  dist::ProcessGroup& replicas = topo.replica_group();
  if (replicas.size() == 1) return all;
  Tensor mine_all = Tensor::from_vector(all, {int64_t(all.size())}, DType::f64);
  Tensor world = Tensor::empty({mine_all.numel() * replicas.size()}, DType::f64);
  replicas.all_gather(world, mine_all)->wait();
  return world.to_vector();
}

}  // namespace

Report::Report(const TrainConfig& o, const dist::Topology& topo, Device device, bool logger, Meter meter)
    : o_(o),
      topo_(topo),
      device_(device),
      logger_(logger),
      meter_(meter),
      progress_(parse_progress_mode(o.progress), o.log_every, logger) {
  if (logger && !o.tensorboard.empty()) tb_ = std::make_unique<EventWriter>(o.tensorboard);
}

Report::~Report() = default;

bool Report::shows(int64_t step) const { return progress_.shows(step + 1, o_.steps); }

void Report::stepped(int64_t step, int64_t first_step, double ms, double data_ms, const dist::ReducerStats& comm,
                     const StepResult& r, double lr, const optim::GradScaler* scaler) {
  if (!device_.is_cuda()) window_ms_ = 0, window_steps_ = 0;  // the CPU's lines show their own step
  window_ms_ += ms;
  ++window_steps_;
  comm_ = comm;
  if (step > first_step || o_.steps == first_step + 1) {
    timed_ms_ += ms, compute_ms_ += ms - comm.exposed_comm_ms, comm_ms_ += comm.comm_ms;
    exposed_ms_ += comm.exposed_comm_ms, ++timed_;
  }
  if (step >= o_.steps - 10 && std::isfinite(r.loss)) recent_loss_ += r.loss, ++recent_;
  if (topo_.grid().size() > 1 && (step + 1) % o_.log_every == 0)
    report_stragglers(step, {ms, data_ms, ms - comm.exposed_comm_ms, comm.exposed_comm_ms});
  if (logger_ && !o_.loss_log.empty()) {
    char entry[64];
    std::snprintf(entry, sizeof entry, "%lld %.17g\n", (long long)(step + 1), r.loss);
    loss_log_ += entry;
  }
  if (!shows(step)) return;
  progress_.update(step + 1, o_.steps, line(step, r.loss, lr, scaler));
  if (tb_) log(step + 1, r, lr, scaler);
}

// The progress line of step `step` (reads the scaler's state: on a device, a synchronisation).
std::string Report::line(int64_t step, double loss, double lr, const optim::GradScaler* scaler) {
  const double ms = shown_ms_ = device_.is_cuda() ? window_ms_ / double(window_steps_) : window_ms_;
  window_ms_ = 0, window_steps_ = 0;
  const double gflops = meter_.flops_per_step / ms / 1e6;
  std::string l = "step " + std::to_string(step + 1) + "/" + std::to_string(o_.steps) + " | loss " + fmt("%.4f", loss) +
                  " | lr " + fmt("%.2e", lr) + " | " + fmt("%.1f", ms) + " ms | " +
                  fmt("%.0f", meter_.tokens_per_step / ms * 1e3) + " tok/s | " + fmt("%.1f", gflops) + " GFLOP/s";
  if (meter_.peak_tflops > 0) l += " | MFU " + fmt("%.1f", 100 * gflops / (meter_.peak_tflops * 1e3)) + "%";
  l += " | peak " + fmt("%.0f", peak_rss_mb()) + " MB";
  if (scaler)
    l += " | scale " + fmt("%g", scaler->current_scale()) + " | skipped " + std::to_string(scaler->skipped_steps());
  if (topo_.dp_group().size() > 1)
    l += " | comm " + fmt("%.1f", comm_.comm_ms) + " ms, exposed " + fmt("%.1f", comm_.exposed_comm_ms) + " ms";
  return l;
}

// The numbers of the last line shown, as TensorBoard scalars at `step` (1-based).
void Report::log(int64_t step, const StepResult& r, double lr, const optim::GradScaler* scaler) const {
  EventWriter& tb = *tb_;
  tb.scalar("train/loss", r.loss, step);
  tb.scalar("lr", lr, step);
  tb.scalar("grad_norm", r.grad_norm, step);
  if (scaler)
    tb.scalar("loss_scale", scaler->current_scale(), step),
        tb.scalar("skipped_steps", double(scaler->skipped_steps()), step);
  tb.scalar("step_ms", shown_ms_, step);
  tb.scalar("tokens_per_s", meter_.tokens_per_step / shown_ms_ * 1e3, step);
  if (meter_.peak_tflops > 0) tb.scalar("mfu", meter_.flops_per_step / shown_ms_ / 1e9 / meter_.peak_tflops, step);
  tb.scalar("exposed_comm_ms", comm_.exposed_comm_ms, step);
  for (const nn::MoE::Load& e : r.experts) {  // a mixture of experts' layers on this rank
    const std::string block = "moe/block_" + std::to_string(e.block) + "/";
    tb.scalar(block + "tokens_max_over_mean", e.max_over_mean, step);
    tb.scalar(block + "dropped_fraction", e.dropped_fraction, step);
    tb.scalar(block + "aux_loss", e.aux_loss, step);
  }
  const MemoryLedger& mem = ledger(device_);
  for (auto [tag, name] : {std::pair{MemTag::kParams, "params"},
                           {MemTag::kGrads, "grads"},
                           {MemTag::kOptimizer, "optimizer"},
                           {MemTag::kActivations, "activations"}})
    tb.scalar(std::string("memory_mb/") + name, double(mem.peak(tag)) / kMiB, step);
}

void Report::print(const std::string& line) { progress_.print(line); }

void Report::validation(int64_t step, double v) {
  progress_.print("step " + std::to_string(step) + ": val_loss " + fmt("%.4f", v));
  if (tb_) tb_->scalar("val/loss", v, step);
}

void Report::end_progress() { progress_.finish(); }

void Report::end(std::optional<double> val_loss, const optim::GradScaler* scaler) {
  progress_.finish();
  if (logger_ && !o_.loss_log.empty()) nn::write_text_file_atomically(o_.loss_log, loss_log_);
  if (val_loss && tb_) tb_->scalar("val/loss", *val_loss, o_.steps);
  const std::string traced = trace::finish();
  if (logger_ && !traced.empty()) std::printf("trace: %s (and every rank's beside it)\n", traced.c_str());
  if (val_loss && logger_) summary(*val_loss, scaler);
}

void Report::summary(double val_loss, const optim::GradScaler* scaler) const {
  auto per_step = [&](double total) { return timed_ ? total / double(timed_) : 0.0; };
  const double ms = per_step(timed_ms_), gflops = ms > 0 ? meter_.flops_per_step / ms / 1e6 : 0.0;
  const MemoryLedger& mem = ledger(device_);  // the training device's ledger (the GPU's, with --device cuda)
  auto mb = [&](MemTag tag) { return double(mem.peak(tag)) / kMiB; };
  std::printf(
      "summary: steps=%lld train_loss=%.9g val_loss=%.9g ms_per_step=%.2f tokens_per_s=%.0f gflops=%.2f "
      "peak_mem_mb=%.1f compute_ms=%.2f comm_ms=%.3f exposed_comm_ms=%.3f loss_scale=%g skipped_steps=%lld "
      "act_peak_mb=%.2f param_mb=%.2f grad_mb=%.2f optim_mb=%.2f mfu=%.4f\n",
      (long long)o_.steps, recent_ ? recent_loss_ / double(recent_) : NAN, val_loss, ms,
      ms > 0 ? meter_.tokens_per_step / ms * 1e3 : 0.0, gflops, peak_rss_mb(), per_step(compute_ms_),
      per_step(comm_ms_), per_step(exposed_ms_), scaler ? scaler->current_scale() : 1.0,
      (long long)(scaler ? scaler->skipped_steps() : 0), mb(MemTag::kActivations), mb(MemTag::kParams),
      mb(MemTag::kGrads), mb(MemTag::kOptimizer), meter_.peak_tflops > 0 ? gflops / (meter_.peak_tflops * 1e3) : NAN);
  std::fflush(stdout);
}

// Every rank's step, data, compute and exposed-communication times gathered, and the logging rank prints the
// slowest and the fastest rank of each with their ranks, flagging a rank whose compute (the step less its exposed
// communication: the others wait for it there) took more than 1.2x the median's (the lower median: at 2 ranks, the
// faster one).
void Report::report_stragglers(int64_t step, const std::array<double, 4>& mine) {
  const std::vector<double> all = gather_every_rank(topo_, mine);
  if (!logger_) return;
  const int world = topo_.grid().size();  // every replica's ranks: a slow one delays every outer sync
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
  progress_.print(line);
}

double mfu_peak_tflops(const TrainConfig& o, const Stage& stage, const dist::Topology& topo, Device device, DType amp,
                       int64_t rows, bool logger) {
  if (o.peak_tflops > 0) return o.peak_tflops;
  if (device.is_cuda()) {
    const double peak = gpu_peak_tflops(device_name(device), amp, o.tf32);
    if (peak <= 0 && logger)
      std::printf("MFU: no dense peak known for '%s' (train/device.cpp's table); pass --peak-tflops for one\n",
                  device_name(device).c_str());
    return peak;
  }
  // The whole model's shapes: a tensor-parallel rank's are smaller, so its MFU is approximate.
  const nn::GPTConfig& c = stage.config();
  const double gflops = ops::SgemmCeiling({c.n_layer, c.n_embd, c.vocab_size, rows}).measure(num_threads());
  return sum_over(topo.replica_group(), sum_over(topo.model_parallel_group(), sum_over(topo.dp_group(), gflops))) / 1e3;
}

// Parameters, gradients and optimizer state are what is held between steps (padding: < N elements per bucket);
// activations the peak (an estimate, the formula's known approximation).
void print_zero_memory(const TrainConfig& o, const Stage& stage, const dist::Topology& topo, Device device, DType amp,
                       int64_t micro_batch, int64_t seq) {
  const MemoryLedger& mem = ledger(device);
  const int64_t M = stage.spec().micro_batches;
  // ZeRO shards over the dp group (dp × cp ranks); a cp rank keeps the activations of its seq / cp positions.
  const MemoryPlan p =
      predict_memory({stage.config(), o.zero, topo.dp_group().size(), amp, stage.chunk(0).recompute(), micro_batch,
                      seq / topo.grid().cp, M, topo.grid().tp, o.sequence_parallel, topo.grid().ep});
  auto pct = [](double measured, double predicted) { return predicted > 0 ? 100 * (measured / predicted - 1) : 0.0; };
  const double params = double(mem.current(MemTag::kParams)), grads = double(mem.current(MemTag::kGrads)),
               optimizer = double(mem.current(MemTag::kOptimizer)), acts = double(mem.peak(MemTag::kActivations));
  std::printf(
      "zero-%d memory, dp rank %d of %d: params=%.3f grads=%.3f optimizer=%.3f activations=%.3f comm=%.3f "
      "MiB; predicted params=%.3f grads=%.3f optimizer=%.3f activations=%.3f MiB; difference params=%+.1f%% "
      "grads=%+.1f%% optimizer=%+.1f%% activations=%+.1f%%\n",
      o.zero, topo.dp_group().rank(), topo.dp_group().size(), params / kMiB, grads / kMiB, optimizer / kMiB,
      acts / kMiB, double(mem.current(MemTag::kComm)) / kMiB, p.params_rest / kMiB, p.grads_rest / kMiB,
      p.optimizer / kMiB, p.activations / kMiB, pct(params, p.params_rest), pct(grads, p.grads_rest),
      pct(optimizer, p.optimizer), pct(acts, p.activations));
  std::fflush(stdout);
}

// The prediction: split parameters / tp + replicated ones, f32; the traffic: what the step asked the tp group to
// move (dist::tensor_parallel_traffic: payload bytes; docs/parallelism.md has the formula).
void print_tensor_parallel_step(const Stage& stage, const dist::Topology& topo, Device device) {
  const MemoryLedger& mem = ledger(device);
  const double tp = topo.grid().tp;
  double predicted = 0;
  for (int v = 0; v < stage.chunk_count(); ++v)
    for (const auto& [name, p] : stage.chunk(v).named_parameters()) {
      const nn::ParamLayout layout = nn::layout_of(p);
      const double whole = 4.0 * double(layout.full_numel());
      predicted += layout.is_split() ? whole / tp : whole;
    }
  const dist::TensorParallelTraffic t = dist::tensor_parallel_traffic();
  std::printf(
      "tp memory, tp rank %d of %d (dp rank %d): params=%.3f grads=%.3f optimizer=%.3f activations=%.3f MiB "
      "(predicted params=%.3f MiB); tp traffic of step 1: all-reduce=%.3f all-gather=%.3f "
      "reduce-scatter=%.3f MiB\n",
      topo.coord().tp, topo.grid().tp, topo.coord().dp, double(mem.current(MemTag::kParams)) / kMiB,
      double(mem.current(MemTag::kGrads)) / kMiB, double(mem.current(MemTag::kOptimizer)) / kMiB,
      double(mem.peak(MemTag::kActivations)) / kMiB, predicted / kMiB, double(t.all_reduce_bytes) / kMiB,
      double(t.all_gather_bytes) / kMiB, double(t.reduce_scatter_bytes) / kMiB);
  std::fflush(stdout);
}

// The logger's ledger has only the first stage's peak: 1F1B keeps about min(M, pp - s) micro-batches on stage s,
// GPipe all M (dist/pipeline.h).
void print_pipeline_report(const Stage& stage, const dist::Topology& topo, Device device, bool logger) {
  dist::ProcessGroup& pp = topo.pp_group();
  const int64_t n = pp.size();
  std::vector<double> per_stage(size_t(2 * n), 0.0);
  per_stage[size_t(pp.rank())] = double(ledger(device).peak(MemTag::kActivations)) / kMiB;
  const Stage::Timing& t = stage.timing();
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

void trace_memory(Device device) {
  if (!trace::enabled()) return;
  const MemoryLedger& mem = ledger(device);
  auto mib = [&](MemTag t) { return double(mem.current(t)) / kMiB; };
  trace::counter("memory MiB", {{"params", mib(MemTag::kParams)},
                                {"grads", mib(MemTag::kGrads)},
                                {"optimizer", mib(MemTag::kOptimizer)},
                                {"activations peak", double(mem.peak(MemTag::kActivations)) / kMiB}});
}

}  // namespace minidl::train
