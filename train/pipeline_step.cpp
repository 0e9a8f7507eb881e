#include "train/pipeline_step.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/upload.h"
#include "dist/tp_gpt.h"
#include "dist/zero.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "optim/clip.h"
#include "train/step.h"
#include "train/zero_sync.h"

namespace minidl::train {

using dist::Action;
using dist::ActionKind;

namespace {

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---- the stage's chunks ----

PipelineModel::PipelineModel(const nn::GPTConfig& cfg, uint64_t seed, const dist::PipelineSpec& spec,
                             const std::vector<int64_t>& starts, const dist::Topology& topology, bool sequence_parallel)
    : topology_(topology),
      schedule_(dist::make_schedule(spec)),
      rank_(topology.coord().pp),
      sequence_parallel_(sequence_parallel && topology.grid().tp > 1) {
  MINIDL_CHECK(spec.stages == topology.grid().pp, "pipeline: the schedule has ", spec.stages,
               " stages but the topology ", topology.grid().pp);
  MINIDL_CHECK(spec.stages >= 2, "pipeline: expected at least 2 stages, got ", spec.stages);
  MINIDL_CHECK(int64_t(starts.size()) == spec.chunks() + 1, "pipeline: expected ", spec.chunks() + 1,
               " block boundaries, got ", starts.size());
  dist::validate_schedule(schedule_);
  const int C = spec.chunks();
  for (int v = 0; v < spec.virtual_stages; ++v) {
    const int64_t c = global_chunk(v);
    const nn::GPTStage part{starts[size_t(c)], starts[size_t(c) + 1], c == 0, c == C - 1};
    if (topology.grid().tp > 1)
      chunks_.push_back(
          std::make_unique<dist::TensorParallelGPT>(cfg, seed, topology.tp_group(), sequence_parallel_, part));
    else
      chunks_.push_back(std::make_unique<nn::GPT>(cfg, seed, part));
  }
}

namespace {

// A stage's tied wte: nn::GPT's, or the vocabulary-parallel slice of a tensor-parallel stage.
Tensor tied_wte(const nn::GPT& chunk) {
  if (auto* split = dynamic_cast<const dist::TensorParallelGPT*>(&chunk)) return split->vocab_embedding->weight;
  return chunk.wte->weight;
}

// The whole (unsplit) parameter count of a chunk: what one process holds for the same blocks.
int64_t logical_parameters(const nn::GPT& chunk) {
  if (auto* split = dynamic_cast<const dist::TensorParallelGPT*>(&chunk)) return split->logical_num_parameters();
  return chunk.num_parameters();
}

}  // namespace

Tensor PipelineModel::embedding_wte() const {
  return chunks_.front()->stage().embedding ? tied_wte(*chunks_.front()) : Tensor();
}

int64_t PipelineModel::positions_per_rank(int64_t T) const {
  return sequence_parallel_ ? T / topology_.grid().tp : T;
}

std::vector<Tensor> PipelineModel::replicated_parameters() const {
  std::vector<Tensor> out;
  for (const auto& c : chunks_)
    if (auto* split = dynamic_cast<const dist::TensorParallelGPT*>(c.get()))
      for (const Tensor& p : split->replicated_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> PipelineModel::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& c : chunks_)
    for (auto& np : c->named_parameters()) out.push_back(np);
  return out;
}

std::vector<Tensor> PipelineModel::parameters() const {
  std::vector<Tensor> out;
  for (auto& np : named_parameters()) out.push_back(np.second);
  return out;
}

Tensor PipelineModel::head_wte() const {
  const nn::GPT& last = *chunks_.back();
  return last.stage().head ? tied_wte(last) : Tensor();
}

void PipelineModel::to(Device device) { for (auto& c : chunks_) c->to(device); }
void PipelineModel::train(bool on) { for (auto& c : chunks_) c->train(on); }
void PipelineModel::set_recompute(nn::Recompute r) { for (auto& c : chunks_) c->set_recompute(r); }
void PipelineModel::zero_grad() { for (auto& c : chunks_) c->zero_grad(); }

void PipelineModel::set_dropout(uint64_t step, int64_t first_sample) {
  for (auto& c : chunks_) {
    c->dropout_context().step = step;
    c->dropout_context().first_sample = first_sample;
  }
}

int64_t PipelineModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& c : chunks_) n += logical_parameters(*c);
  if (last_stage()) n -= config().vocab_size * config().n_embd;  // the first stage counts wte
  return int64_t(sum_over(pp_group(), double(n)));
}

double PipelineModel::flops_per_token(int64_t T) const {
  // nanoGPT's 6·N + 12·L·C·T (nn::GPT::flops_per_token) with N the whole model's parameters without wpe.
  const nn::GPTConfig& c = config();
  const double n = double(num_parameters() - c.block_size * c.n_embd);
  return 6.0 * n + 12.0 * double(c.n_layer) * double(c.n_embd) * double(T);
}

// ---- gradient synchronisation ----

namespace {

dist::ZeroOptions zero_options(int stage) {
  dist::ZeroOptions o;
  o.stage = stage;
  return o;
}

}  // namespace

struct PipelineSync::Zero {
  Zero(PipelineModel& pipe, dist::ProcessGroup& dp, int stage)
      : zero(pipe.named_parameters(), dp, zero_options(stage)),
        no_sync(zero.reducer()),
        origin(shard_origins(zero.shard_params(), zero.shard_owners(), zero.reducer().params())) {}
  dist::ZeroDataParallel zero;
  dist::Reducer::NoSyncGuard no_sync;  // for good: the hooks only accumulate, after_backward reduce-scatters
  std::unordered_map<const TensorImpl*, Tensor> origin;
};

PipelineSync::PipelineSync(PipelineModel& pipe, const dist::Topology& topology, int zero_stage)
    : pipe_(pipe), topology_(topology) {
  MINIDL_CHECK(zero_stage >= 0 && zero_stage <= 2, "pipeline: ZeRO stage ", zero_stage,
               " is not supported with pipeline parallelism (expected 0, 1 or 2)");
  if (zero_stage > 0) zero_ = std::make_unique<Zero>(pipe, topology.dp_group(), zero_stage);
}

PipelineSync::~PipelineSync() = default;

const char* PipelineSync::name() const {
  return !zero_ ? "pipeline" : zero_->zero.stage() == 1 ? "pipeline+zero1" : "pipeline+zero2";
}

void PipelineSync::after_backward() {
  auto t0 = std::chrono::steady_clock::now();
  if (dist::ProcessGroup* emb = topology_.embedding_group()) {
    // The first stage's wte gradient comes from the embedding, the last stage's from the head: both need the sum.
    Tensor wte = pipe_.first_stage() ? pipe_.embedding_wte() : pipe_.head_wte();
    Tensor g = wte.grad();
    emb->all_reduce(g, dist::ReduceOp::kSum)->wait();
  }
  dist::ProcessGroup& dp = topology_.dp_group();
  if (zero_) {
    zero_->zero.reduce_scatter_gradients();
  } else if (dp.size() > 1) {
    for (Tensor& p : pipe_.parameters()) {
      Tensor g = p.grad();
      dp.all_reduce(g, dist::ReduceOp::kAvg)->wait();
    }
  }
  stats_.comm_ms = stats_.exposed_comm_ms = elapsed_ms(t0);
}

std::vector<Tensor> PipelineSync::owned_params(const std::vector<Tensor>& params) {
  return zero_ ? zero_->zero.shard_params() : params;
}

Tensor PipelineSync::origin(const Tensor& owned) const {
  return zero_ ? origin_in(zero_->origin, owned) : owned;
}

std::vector<optim::ParamGroup> PipelineSync::optimizer_groups(std::vector<optim::ParamGroup> groups) {
  return zero_ ? zero_->zero.shard_groups(groups) : groups;
}

dist::ZeroDataParallel* PipelineSync::zero() { return zero_ ? &zero_->zero : nullptr; }

void PipelineSync::after_step() {
  if (zero_) zero_->zero.gather_parameters();
}

double PipelineSync::grad_norm_squared(const std::vector<Tensor>& params) {
  std::vector<Tensor> counted;
  Tensor skip = pipe_.last_stage() ? pipe_.head_wte() : Tensor();
  for (const Tensor& p : params)
    if (!skip.defined() || origin(p).impl() != skip.impl()) counted.push_back(p);
  double mine = optim::grad_norm_squared(counted);
  if (zero_) mine = sum_over(topology_.dp_group(), mine);  // each dp rank holds its shard
  return sum_over(topology_.model_parallel_group(), mine);
}

Tensor PipelineSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> counted;  // as grad_norm_squared
  Tensor skip = pipe_.last_stage() ? pipe_.head_wte() : Tensor();
  for (const Tensor& p : params)
    if (!skip.defined() || origin(p).impl() != skip.impl()) counted.push_back(p);
  Tensor mine = optim::grad_norm_squared_tensor(counted, device);
  if (zero_) mine = sum_over(topology_.dp_group(), mine);  // each dp rank holds its shard
  return sum_over(topology_.model_parallel_group(), mine);
}

void PipelineSync::combine_overflow_on_device(const Tensor& found_inf) {
  max_over(topology_.model_parallel_group(), max_over(topology_.dp_group(), found_inf));
}

bool PipelineSync::combine_overflow(bool local) {
  double any = max_over(topology_.dp_group(), local ? 1.0 : 0.0);
  return max_over(topology_.model_parallel_group(), any) > 0;
}

// ---- the executor ----

namespace {

// One step's execution state on a rank: the tensors of every (micro, chunk) between its forward and its backward,
// the posted receives and sends.
struct Executor {
  Executor(PipelineModel& p, const data::Batch& b, const StepOptions& opts) : pipe(p), batch(b), o(opts) {}
  PipelineModel& pipe;
  const data::Batch& batch;
  const StepOptions& o;
  // The ids (first stage) and targets (last stage) of the whole batch where the chunks read them: the host batch
  // on the CPU; on a device, checked on the host and uploaded once per step (select_inputs).
  Tensor ids, targets;
  int64_t micro = 0, T = 0;
  double inv_targets = 1;
  uint64_t step = 0;
  int64_t first_sample = 0;
  Device device;
  // What crosses a stage boundary: a block's output, which under autocast is in the autocast dtype (as in one
  // process, where the next block reads it), and its gradient in the same dtype.
  DType wire = DType::f32;
  struct Saved {
    Tensor input;   // the received activation (a leaf requiring grad); undefined on chunk 0
    Tensor output;  // the chunk's output, or the (scaled) loss on the last chunk
  };
  std::map<std::pair<int, int>, Saved> saved;  // (micro, chunk)
  struct Posted {
    Tensor buffer;
    std::shared_ptr<dist::Work> work;
  };
  std::map<std::tuple<bool, int, int>, Posted> received;  // (gradient?, micro, chunk)
  std::vector<std::pair<Tensor, std::shared_ptr<dist::Work>>> sends;
  Tensor loss_sum;
  double wait_ms = 0;  // idle: blocked on a peer

  void wait_for(dist::Work& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work.wait();
    wait_ms += elapsed_ms(t0);
  }

  const dist::PipelineSpec& spec() const { return pipe.spec(); }
  bool is_last_chunk(int v) const { return pipe.global_chunk(v) == spec().chunks() - 1; }

  Tensor take(bool grad, int m, int v) {
    auto it = received.find({grad, m, v});
    MINIDL_ASSERT(it != received.end(), "pipeline: no receive posted for ", grad ? "gradient" : "activation",
                  " m=", m, " v=", v, " (the schedule was validated)");
    wait_for(*it->second.work);
    Tensor t = it->second.buffer;
    received.erase(it);
    return t;
  }

  void select_micro_batch(int m) { pipe.set_dropout(step, first_sample + m * micro); }

  void run(const Action& a) {
    dist::ProcessGroup& pg = pipe.pp_group();
    const int tag = a.peer >= 0 ? dist::message_tag(spec(), a, pipe.rank()) : 0;
    const int64_t C = pipe.config().n_embd;
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        Posted p{Tensor::empty({micro, pipe.positions_per_rank(T), C}, wire, device), nullptr};
        p.work = pg.recv(p.buffer, a.peer, tag);
        received[{a.kind == ActionKind::kRecvGrad, a.micro, a.chunk}] = p;
        break;
      }
      case ActionKind::kForward: {
        nn::GPT& chunk = *pipe.chunks()[size_t(a.chunk)];
        // Micro-batch m's dropout masks are those of its samples in one big batch (a recomputation in backward
        // pins the context it saw here: nn/gpt.cpp).
        select_micro_batch(a.micro);
        Saved s;
        Tensor x;
        if (pipe.global_chunk(a.chunk) == 0) {
          x = chunk.embed(ids.narrow(0, a.micro * micro, micro).to(device));
        } else {
          s.input = take(false, a.micro, a.chunk);
          s.input.set_requires_grad(true);
          x = s.input;
        }
        Tensor y = chunk.blocks(chunk.stage().first_block, chunk.stage().last_block, x);
        if (is_last_chunk(a.chunk)) {
          Tensor loss = mul(chunk.head_loss(y, targets.narrow(0, a.micro * micro, micro).to(device), Reduction::kSum),
                            inv_targets);
          loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
          y = o.scaler ? o.scaler->scale(loss) : loss;
        } else {
          MINIDL_ASSERT(y.dtype() == wire, "pipeline: expected a ", wire, " activation between stages, got ",
                        y.dtype());
        }
        s.output = y;
        saved[{a.micro, a.chunk}] = s;
        break;
      }
      case ActionKind::kSendActivation: {
        Tensor y = saved.at({a.micro, a.chunk}).output.detach().contiguous();
        sends.push_back({y, pg.send(y, a.peer, tag)});
        break;
      }
      case ActionKind::kBackward: {
        auto it = saved.find({a.micro, a.chunk});
        Saved s = it->second;
        saved.erase(it);
        if (is_last_chunk(a.chunk)) s.output.backward();
        else s.output.backward(take(true, a.micro, a.chunk));
        if (s.input.defined()) saved[{a.micro, a.chunk}] = Saved{s.input, Tensor()};  // its gradient, to send
        break;
      }
      case ActionKind::kSendGrad: {
        auto it = saved.find({a.micro, a.chunk});
        Tensor g = it->second.input.grad().contiguous();
        MINIDL_ASSERT(g.dtype() == wire, "pipeline: expected a ", wire, " gradient between stages, got ", g.dtype());
        saved.erase(it);
        sends.push_back({g, pg.send(g, a.peer, tag)});
        break;
      }
      case ActionKind::kOptimizerStep:
        for (auto& s : sends) wait_for(*s.second);
        sends.clear();
        break;
    }
  }
};

}  // namespace

namespace {

// On a device, a host batch is range-checked on the host (GPT::check_ids: the same messages) and uploaded once as
// i64, the device kernels' index type, through pinned staging without a host wait (core/upload.h), as GPT::loss
// does; returns whether the ids and targets the executor reads
// were checked that way (then ops::HostCheckedIndicesGuard spares the device ops a copy back per micro-batch).
bool select_inputs(Executor& ex) {
  ex.ids = ex.batch.x;
  ex.targets = ex.batch.y;
  if (ex.o.batch_checked) return true;  // a device batch drawn from a checked split (StepOptions::batch_checked)
  if (!ex.device.is_cuda() || !ex.batch.x.device().is_cpu() || !ex.batch.y.device().is_cpu()) return false;
  const nn::GPT& first = *ex.pipe.chunks().front();
  if (first.stage().embedding) {
    first.check_ids(ex.batch.x, "token ids", false);
    ex.ids = upload_async(ops::cast(ex.batch.x.contiguous(), DType::i64), ex.device);
  }
  const nn::GPT& last = *ex.pipe.chunks().back();
  if (last.stage().head) {
    last.check_ids(ex.batch.y, "targets", true);
    ex.targets = upload_async(ops::cast(ex.batch.y.contiguous(), DType::i64), ex.device);
  }
  return true;
}

// pipeline_forward_backward without reading anything: the loss sum where it was computed (last stage), else
// undefined.
Tensor forward_backward(PipelineModel& pipe, const data::Batch& batch, const StepOptions& o) {
  const dist::PipelineSpec& spec = pipe.spec();
  const int64_t rows = batch.x.size(0), M = spec.micro_batches;
  MINIDL_CHECK(rows % M == 0, "pipeline: a batch of ", rows, " sequences does not split into --micro-batches ", M,
               " equal micro-batches");
  MINIDL_CHECK(o.amp == DType::f32 || ops::is_half(o.amp), "pipeline: amp must be f32 (off), bf16 or f16, got ",
               o.amp);
  Executor ex(pipe, batch, o);
  ex.micro = rows / M;
  ex.T = batch.x.size(1);
  ex.inv_targets =
      1.0 / double(std::max<int64_t>(1, o.target_count >= 0 ? o.target_count : count_targets(batch.y)));
  ex.step = pipe.dropout_step();
  ex.first_sample = pipe.dropout_first_sample();
  ex.device = pipe.parameters().front().device();
  ex.wire = o.amp;
  std::optional<ops::HostCheckedIndicesGuard> checked;
  if (select_inputs(ex)) checked.emplace();
  {
    MemoryTagGuard tag(MemTag::kActivations);
    // One guard over the whole schedule: the 16-bit weight copies are made once per step (autograd/autocast.h).
    std::optional<autograd::AutocastGuard> autocast;
    if (o.amp != DType::f32) autocast.emplace(o.amp);
    const auto t0 = std::chrono::steady_clock::now();
    for (const Action& a : pipe.schedule().ranks[size_t(pipe.rank())]) ex.run(a);
    PipelineModel::Timing& timing = pipe.timing();
    timing.schedule_ms += elapsed_ms(t0);
    timing.wait_ms += ex.wait_ms;
    timing.steps += 1;
    if (o.grad_sync) o.grad_sync->after_backward();
  }
  pipe.set_dropout(ex.step + 1, ex.first_sample);
  return pipe.last_stage() ? ex.loss_sum : Tensor();
}

}  // namespace

double pipeline_forward_backward(PipelineModel& pipe, const data::Batch& batch, const StepOptions& o) {
  Tensor loss_sum = forward_backward(pipe, batch, o);
  return loss_sum.defined() ? loss_sum.item() : 0.0;
}

StepResult pipeline_train_step(PipelineModel& pipe, optim::Optimizer& optimizer, const data::Batch& batch,
                               const StepOptions& o) {
  StepResult r;
  const Device device = pipe.parameters().front().device();
  if (!device.is_cuda()) {
    r.loss_scale = o.scaler ? o.scaler->current_scale() : 1.0;
    // The loss exists on the last stage: share it (zeros elsewhere, so the sum is exact).
    r.loss = sum_over(pipe.pp_group(), pipeline_forward_backward(pipe, batch, o));
  } else {
    // As train_step on a device: the scale and the loss stay there (apply_step reads them only with read_back).
    if (o.scaler) {
      o.scaler->keep_state_on(device);
      r.loss_scale = NAN;
      r.on_device.loss_scale = o.scaler->scale(Tensor::ones({}, DType::f32, device)).detach();
    }
    Tensor loss_sum = forward_backward(pipe, batch, o);
    // Shared by an all-reduce on the device, zeros on the stages without the loss: x + 0 is x, so the value read
    // back is the last stage's f32 sum, as the host sum of that value and zeros was.
    Tensor shared = loss_sum.defined() ? ops::cast(loss_sum, DType::f32).reshape({}).contiguous()
                                       : Tensor::zeros({}, DType::f32, device);
    r.loss = NAN;
    r.on_device.loss = sum_over(pipe.pp_group(), shared);
  }

  std::vector<Tensor> params = o.grad_sync ? o.grad_sync->owned_params(pipe.parameters()) : pipe.parameters();
  return apply_step(optimizer, params, o, std::move(r));
}

double pipeline_evaluate(PipelineModel& pipe, const data::Batch& windows, int64_t batch) {
  autograd::NoGradGuard no_grad;
  MemoryTagGuard tag(MemTag::kActivations);
  pipe.train(false);
  const dist::Topology& topo = pipe.topology();
  dist::ProcessGroup& pp = pipe.pp_group();
  dist::ProcessGroup& dp = topo.dp_group();
  const dist::PipelineSpec& spec = pipe.spec();
  const int p = spec.stages, C = spec.chunks();
  const Device device = pipe.parameters().front().device();
  const int64_t n = windows.x.size(0), batches = (n + batch - 1) / batch, width = pipe.config().n_embd;
  std::vector<double> sums(size_t(batches), 0.0);
  for (int64_t i = dp.rank(); i < batches; i += dp.size()) {
    const int64_t b = i * batch, m = std::min(batch, n - b), T = windows.x.size(1);
    // The chunks in global order: a single chain, so blocking sends and receives cannot deadlock.
    Tensor x;
    for (int c = 0; c < C; ++c) {
      if (c % p != pipe.rank()) continue;
      nn::GPT& chunk = *pipe.chunks()[size_t(c / p)];
      if (c == 0) {
        x = chunk.embed(windows.x.narrow(0, b, m).to(device));
      } else {
        x = Tensor::empty({m, pipe.positions_per_rank(T), width}, DType::f32, device);
        pp.recv(x, (c - 1) % p, 0)->wait();
      }
      x = chunk.blocks(chunk.stage().first_block, chunk.stage().last_block, x);
      if (c == C - 1) {
        Tensor loss = chunk.head_loss(x, windows.y.narrow(0, b, m).to(device));
        sums[size_t(i)] = loss.item() * double(m);
      } else {
        x = x.contiguous();
        pp.send(x, (c + 1) % p, 0)->wait();
      }
    }
  }
  // Batch i's sum on the one rank that computed it (last stage of dp rank i mod dp), zeros elsewhere: exact sums.
  Tensor all = Tensor::from_vector(sums, {batches}, DType::f64).to(pp.device());
  if (pp.size() > 1) pp.all_reduce(all, dist::ReduceOp::kSum)->wait();
  if (dp.size() > 1) dp.all_reduce(all, dist::ReduceOp::kSum)->wait();
  double total = 0;
  for (double s : all.to_vector()) total += s;
  pipe.train(true);
  return total / double(n);
}

}  // namespace minidl::train
