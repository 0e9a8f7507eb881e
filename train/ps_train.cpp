#include "train/ps_train.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "dist/init.h"
#include "dist/parameter_server.h"
#include "nn/atomic_file.h"
#include "nn/checkpoint.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/batches.h"
#include "train/evaluate.h"
#include "train/parallel_model.h"
#include "train/step.h"

namespace minidl::train {

namespace {

// The tensors' values (or their gradients) end to end in `flat`, which keeps its memory from one step to the next:
// a fresh vector of the model's size a step costs more in page faults than the copy itself (perf: 7 ms of a 100 ms
// step on the baby model, through a temporary per tensor).
void flat_into(const std::vector<Tensor>& ts, bool grads, std::vector<float>& flat) {
  size_t n = 0;
  for (const Tensor& t : ts) n += size_t(t.numel());
  flat.resize(n);
  size_t at = 0;
  for (const Tensor& t : ts) {
    const Tensor src = (grads ? t.grad() : t).detach().contiguous();
    MINIDL_ASSERT(src.dtype() == DType::f32 && src.device().is_cpu(), "the parameter server trains f32 on the CPU");
    std::copy_n(src.data<float>(), src.numel(), flat.data() + at);
    at += size_t(t.numel());
  }
}

std::vector<float> flat_of(const std::vector<Tensor>& ts, bool grads) {
  std::vector<float> flat;
  flat_into(ts, grads, flat);
  return flat;
}

// flat's values, from `at` on, into the tensors (or their gradients, allocated where missing), in place.
void write_flat(const std::vector<float>& flat, const std::vector<Tensor>& ts, size_t at = 0, bool grads = false) {
  for (const Tensor& t : ts) {
    if (grads && !t.grad().defined()) Tensor(t).set_grad(Tensor::empty(t.shape()));  // a handle on t itself
    const Tensor dst = grads ? t.grad() : t.detach();
    MINIDL_ASSERT(dst.is_contiguous() && dst.dtype() == DType::f32 && dst.device().is_cpu(),
                  "the parameter server trains f32 on the CPU");
    std::copy_n(flat.data() + at, dst.numel(), dst.data<float>());
    at += size_t(t.numel());
  }
}

// What every rank builds: the one-process model (its initialisation from --seed) as one stage, on a topology of
// this rank alone, and where the servers' ranges end (at tensor boundaries).
struct Model {
  std::unique_ptr<dist::Topology> self;
  ParallelModel built;
  std::vector<std::pair<std::string, Tensor>> named;
  std::vector<Tensor> params;
  dist::PsLayout layout;
};

Model one_process_model(const TrainConfig& o, const data::TextDataset& ds, int workers, int servers,
                        int64_t first_sample) {
  Model m;
  m.self = std::make_unique<dist::Topology>(MPI_COMM_SELF, dist::Grid{1, 1, 1, 1}, "mpi", Device::cpu());
  const nn::GPTConfig cfg = model_config(o, ds.tokenizer().size(), nullptr, "");
  m.built = build_model_and_sync(o, cfg, *m.self, Device::cpu(), first_sample, {});
  m.named = m.built.stage->named_parameters();
  std::vector<int64_t> sizes;
  for (auto& [name, p] : m.named) m.params.push_back(p), sizes.push_back(p.numel());
  m.layout = {workers, servers, 0, dist::bounds_at_tensors(sizes, servers)};
  m.layout.numel = m.layout.bounds.back();
  return m;
}

// A server's update: AdamW on its whole tensors through train::apply_step, as a DDP rank steps its copy.
class ServerStep {
 public:
  ServerStep(const TrainConfig& o, const Model& m, int server, dist::PsMode mode)
      : o_(o),
        workers_(m.layout.workers),
        sync_(mode == dist::PsMode::kSync),
        schedule_(o.lr, o.min_lr.value_or(o.lr), o.warmup, std::max<int64_t>(o.steps, 1)) {
    int64_t at = 0;
    std::vector<std::pair<std::string, Tensor>> mine;
    for (auto& [name, p] : m.named) {
      if (at >= m.layout.begin(server) && at < m.layout.end(server)) mine.emplace_back(name, p), params_.push_back(p);
      at += p.numel();
    }
    adamw_ = std::make_unique<optim::AdamW>(optim::decay_groups(mine, o.weight_decay), optim::AdamWOptions{o.lr});
  }
  void operator()(std::vector<float>& shard, const std::vector<float>& grad) {
    write_flat(shard, params_);  // the replay's shard at this version (the server's own already is)
    write_flat(grad, params_, 0, true);
    // The schedule's position: the step (sync), or how many steps' worth of pushes came in (async, ssp).
    const int64_t position = sync_ ? applied_ : applied_ / workers_;
    ++applied_;
    StepOptions so{.grad_clip = o_.grad_clip, .grad_sync = &GradSync::one_process()};
    so.lr = schedule_(position);
    apply_step(*adamw_, params_, so, {});
    flat_into(params_, false, shard);
  }
  std::vector<float> shard() const { return flat_of(params_, false); }

 private:
  const TrainConfig& o_;
  int workers_;
  bool sync_;
  optim::CosineSchedule schedule_;
  std::vector<Tensor> params_;
  std::unique_ptr<optim::AdamW> adamw_;
  int64_t applied_ = 0;
};

// A worker's optimizer: its step pushes the gradient and takes the parameters the servers send back.
class PushPull final : public optim::Optimizer {
 public:
  PushPull(std::vector<Tensor> params, std::function<const std::vector<float>&(const std::vector<float>&)> exchange)
      : Optimizer({optim::ParamGroup{params, 0.0}}, 0.0, "parameter server"),
        params_(std::move(params)),
        exchange_(std::move(exchange)) {}
  void step() override {
    flat_into(params_, true, grad_);
    write_flat(exchange_(grad_), params_);
  }

 private:
  std::vector<Tensor> params_;
  std::vector<float> grad_;  // kept from step to step
  std::function<const std::vector<float>&(const std::vector<float>&)> exchange_;
};

StepOptions worker_step_options(const TrainConfig& o) {
  return StepOptions{.grad_clip = 0, .amp = amp_dtype(o.amp), .grad_sync = &GradSync::one_process()};
}

std::string histogram_text(const std::vector<int64_t>& h) {
  std::string out;
  for (size_t k = 0; k < h.size(); ++k)
    if (h[k]) out += (out.empty() ? std::string() : std::string(" ")) + std::to_string(k) + ':' + std::to_string(h[k]);
  return out.empty() ? "none" : out;
}

// The run's end on worker 0: the model's validation loss, the summary, --save.
double finish(const TrainConfig& o, const data::TextDataset& ds, Model& m, int64_t seq, const std::string& extra) {
  Stage& stage = *m.built.stage;
  const int64_t windows = std::min<int64_t>(o.eval_windows, int64_t(ds.val().size()) / (seq + 1));
  const double val = train::evaluate(stage, data::eval_windows(ds.val(), seq, windows), o.batch);
  std::printf("validation: %.4f over %lld windows of %lld tokens\n", val, (long long)windows, (long long)seq);
  std::printf("%s", extra.c_str());
  if (!o.save.empty()) {
    char v[32];
    std::snprintf(v, sizeof v, "%.6f", val);  // the metadata train_gpt's own --save writes
    nn::save_gpt(o.save, stage.chunk(0), ds.tokenizer().to_json().dump(),
                 {{"steps", std::to_string(o.steps)}, {"val_loss", v}});
    std::printf("saved %s\n", o.save.c_str());
  }
  return val;
}

}  // namespace

int train_with_parameter_server(const TrainConfig& o, const dist::Context& ctx) {
  const int S = o.ps, W = ctx.world_size() - S, rank = ctx.rank();
  dist::PsOptions mode = dist::ps_options(o.ps_mode);
  mode.backup = o.backup_workers;
  const data::TextDataset ds = open_dataset(o, nullptr);
  const int64_t seq = o.seq_or_default(), local = o.batch / W;
  Model m = one_process_model(o, ds, W, S, rank < W ? rank * local : 0);
  MPI_Comm comm;
  MINIDL_MPI_CHECK(MPI_Comm_dup(ctx.world(), &comm));
  if (rank >= W) {  // a server: its range of the model, until every worker pushed every step
    const int j = rank - W;
    ServerStep step(o, m, j, mode.mode);
    dist::ParameterServer server(comm, m.layout, j, step.shard(), std::ref(step), mode);
    server.serve(o.steps);
    double none = 0;
    MINIDL_MPI_CHECK(MPI_Reduce(&none, nullptr, 1, MPI_DOUBLE, MPI_MAX, 0, comm));  // the workers' time, below
    MINIDL_MPI_CHECK(MPI_Reduce(&none, nullptr, 1, MPI_DOUBLE, MPI_SUM, 0, comm));  // and their loss
    int64_t zero = 0;
    MINIDL_MPI_CHECK(MPI_Reduce(&zero, nullptr, 1, MPI_INT64_T, MPI_SUM, 0, comm));
    // Then, in the order worker 0 receives them (after the reductions it takes part in: a log longer than MPI's
    // eager limit waits for its receive, and sent before them it would wait forever), the late gradients per worker
    // and the log.
    std::vector<int64_t> log = server.dropped();
    for (const dist::PsPush& p : server.log()) log.insert(log.end(), {p.worker, p.step, p.computed, p.version});
    const int n = int(log.size());
    MINIDL_MPI_CHECK(MPI_Send(&n, 1, MPI_INT, 0, 1, comm));
    MINIDL_MPI_CHECK(MPI_Send(log.data(), n, MPI_INT64_T, 0, 2, comm));
    MPI_Comm_free(&comm);
    return 0;
  }
  if (rank == 0)
    std::printf(
        "minidl train_gpt: parameter server %s, %d server%s, %d workers, %lld parameters, batch %lld (%lld a "
        "worker), %lld steps; evaluation at the end\n",
        o.ps_mode.c_str(), S, S > 1 ? "s" : "", W, (long long)m.layout.numel, (long long)o.batch, (long long)local,
        (long long)o.steps);
  dist::PsWorker worker(comm, m.layout, rank);
  write_flat(worker.pull(), m.params);
  int64_t step = 0;
  PushPull exchange(
      m.params, [&](const std::vector<float>& g) -> const std::vector<float>& { return worker.push_pull(step, g); });
  Batches batches(ds, *m.built.stage, o, seq, rank * local, local);
  const std::pair<int, int> delay = o.injected_delay();
  // Timed from the end of the first step, as the trainer's ms_per_step is (the first step allocates and pulls
  // version 0); with one step, from the start.
  auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  std::vector<double> recent;          // this worker's last 10 losses
  for (; !worker.stopped(); ++step) {  // until the servers say stop (async: fast workers do more steps)
    if (delay.first == rank) std::this_thread::sleep_for(std::chrono::milliseconds(delay.second));
    const StepResult r = batches.step(*m.built.stage, exchange, step, worker_step_options(o));
    if (step == 0 && o.steps > 1) t0 = std::chrono::steady_clock::now();
    recent.push_back(r.loss);
    if (recent.size() > 10) recent.erase(recent.begin());
    if (rank == 0 && (step + 1) % o.log_every == 0)
      std::printf("step %lld | loss %.4f (worker 0)\n", (long long)step + 1, r.loss);
  }
  for (double l : recent) loss_sum += l;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  write_flat(worker.final_pull(), m.params);  // every worker's last gradient in
  double all_ms = ms;                         // the slowest worker's time sets the job's tokens/s
  MINIDL_MPI_CHECK(MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &all_ms, &all_ms, 1, MPI_DOUBLE, MPI_MAX, 0, comm));
  MINIDL_MPI_CHECK(MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &loss_sum, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, 0, comm));
  int64_t loss_count = int64_t(recent.size());
  MINIDL_MPI_CHECK(MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &loss_count, &loss_count, 1, MPI_INT64_T, MPI_SUM, 0, comm));
  if (rank != 0) return MPI_Comm_free(&comm), 0;
  // The servers' logs: the staleness histogram, SSP's bound, --ps-log.
  std::vector<std::vector<dist::PsPush>> logs(static_cast<size_t>(S));
  std::vector<int64_t> dropped(static_cast<size_t>(W), 0);
  for (int j = 0; j < S; ++j) {
    int n = 0;
    MINIDL_MPI_CHECK(MPI_Recv(&n, 1, MPI_INT, W + j, 1, comm, MPI_STATUS_IGNORE));
    std::vector<int64_t> flat(static_cast<size_t>(n));
    MINIDL_MPI_CHECK(MPI_Recv(flat.data(), n, MPI_INT64_T, W + j, 2, comm, MPI_STATUS_IGNORE));
    for (int w = 0; w < W; ++w) dropped[size_t(w)] += flat[size_t(w)];
    for (size_t e = size_t(W); e + 3 < flat.size(); e += 4) {
      logs[size_t(j)].push_back({int(flat[e]), flat[e + 1], flat[e + 2], flat[e + 3]});
    }
  }
  MPI_Comm_free(&comm);
  std::vector<int64_t> per_worker(static_cast<size_t>(W), 0);
  for (const dist::PsPush& p : logs[0]) ++per_worker[size_t(p.worker)];
  std::string counts;
  for (int64_t c : per_worker) counts += (counts.empty() ? std::string() : std::string(" ")) + std::to_string(c);
  std::string extra = std::string("parameter server: ") + std::to_string(logs[0].size()) +
                      " pushes a server (per worker: " + counts + "); staleness (versions: count) " +
                      histogram_text(dist::staleness_histogram(logs)) + "\n";
  if (mode.backup > 0) {
    std::string late;
    for (int64_t d : dropped) late += (late.empty() ? std::string() : std::string(" ")) + std::to_string(d);
    extra += "backup workers " + std::to_string(mode.backup) + ": each step took the first " +
             std::to_string(W - mode.backup) + " gradients; dropped as late, per worker: " + late + "\n";
  }
  if (mode.mode == dist::PsMode::kSsp) {
    for (int j = 0; j < S; ++j) {
      const std::string why = dist::ssp_violation(logs[size_t(j)], W, mode.staleness);
      MINIDL_CHECK(why.empty(), "--ps-mode ", o.ps_mode, ": server ", j, "'s log breaks the bound: ", why);
    }
    extra += std::string("ssp: the bound ") + std::to_string(mode.staleness) + " holds in every server's log\n";
  }
  if (!o.ps_log.empty()) {
    std::string text = nlohmann::json{{"format", "minidl-ps-log"},
                                      {"mode", o.ps_mode},
                                      {"backup", mode.backup},
                                      {"workers", W},
                                      {"servers", S},
                                      {"steps", o.steps},
                                      {"bounds", m.layout.bounds}}
                           .dump() +
                       "\n";
    for (int j = 0; j < S; ++j)
      for (const dist::PsPush& p : logs[size_t(j)])
        text +=
            nlohmann::json{
                {"server", j}, {"worker", p.worker}, {"step", p.step}, {"computed", p.computed}, {"version", p.version}}
                .dump() +
            "\n";
    nn::write_text_file_atomically(o.ps_log, text);
    extra += std::string("wrote ") + o.ps_log + "\n";
  }
  const double val = finish(o, ds, m, seq, extra);
  const int64_t timed = o.steps > 1 ? o.steps - 1 : 1;  // the steps after the first: the job's, not one worker's
  std::printf("summary: steps=%lld train_loss=%.8f val_loss=%.8f ms_per_step=%.2f tokens_per_s=%.0f\n",
              (long long)o.steps, loss_sum / double(std::max<int64_t>(1, loss_count)), val, all_ms / double(timed),
              double(o.batch) * double(seq) * double(timed) / (all_ms / 1e3));
  return 0;
}

int replay_parameter_server(const TrainConfig& o) {
  std::ifstream in(o.ps_replay);
  std::string line;
  MINIDL_CHECK(std::getline(in, line), "--ps-replay ", o.ps_replay, ": empty");
  nlohmann::json head;
  int W = 0, S = 0;
  std::vector<std::vector<dist::PsPush>> logs;
  try {
    head = nlohmann::json::parse(line);
    MINIDL_CHECK(head.at("format") == "minidl-ps-log", "--ps-replay ", o.ps_replay, ": not a minidl-ps-log");
    W = head.at("workers").get<int>(), S = head.at("servers").get<int>();
    MINIDL_CHECK(head.at("steps").get<int64_t>() == o.steps, "--ps-replay ", o.ps_replay, ": the log is of ",
                 head.at("steps").get<int64_t>(), " steps, this run has --steps ", o.steps);
    logs.resize(size_t(S));
    while (std::getline(in, line)) {
      const nlohmann::json e = nlohmann::json::parse(line);
      logs.at(e.at("server").get<size_t>())
          .push_back({e.at("worker").get<int>(), e.at("step").get<int64_t>(), e.at("computed").get<int64_t>(),
                      e.at("version").get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) { MINIDL_CHECK(false, "--ps-replay ", o.ps_replay, ": ", e.what()); }
  dist::PsOptions mode = dist::ps_options(head.at("mode").get<std::string>());
  mode.backup = head.value("backup", 0);
  const data::TextDataset ds = open_dataset(o, nullptr);
  const int64_t seq = o.seq_or_default(), local = o.batch / W;
  Model m = one_process_model(o, ds, W, S, 0);
  MINIDL_CHECK(head.at("bounds").get<std::vector<int64_t>>() == m.layout.bounds, "--ps-replay ", o.ps_replay,
               ": the log's servers split another model (the flags must be the run's)");
  std::vector<std::unique_ptr<ServerStep>> servers;
  for (int j = 0; j < S; ++j) servers.push_back(std::make_unique<ServerStep>(o, m, j, mode.mode));
  // A gradient of worker w at step s: the worker's own batch through the one executor, on `params`.
  std::vector<float> captured, unchanged;
  PushPull capture(m.params, [&](const std::vector<float>& g) -> const std::vector<float>& {
    captured = g;
    return unchanged = flat_of(m.params, false);
  });
  std::vector<std::unique_ptr<Batches>> batches;
  for (int w = 0; w < W; ++w)
    batches.push_back(std::make_unique<Batches>(ds, *m.built.stage, o, seq, w * local, local));
  const std::vector<float> initial = flat_of(m.params, false);
  const std::vector<float> final_params = dist::ps_replay(
      m.layout, logs, initial,
      [&](int w, int64_t step, const std::vector<float>& params) {
        write_flat(params, m.params);
        batches[size_t(w)]->step(*m.built.stage, capture, step, worker_step_options(o));
        return captured;
      },
      [&](int j, std::vector<float>& shard, const std::vector<float>& grad) { (*servers[size_t(j)])(shard, grad); },
      mode);
  write_flat(final_params, m.params);
  std::printf("minidl train_gpt: replayed %s (%s, %d workers, %d servers) in one process\n", o.ps_replay.c_str(),
              head.at("mode").get<std::string>().c_str(), W, S);
  const double val = finish(o, ds, m, seq, "");
  std::printf("summary: steps=%lld val_loss=%.8f\n", (long long)o.steps, val);
  return 0;
}

}  // namespace minidl::train
