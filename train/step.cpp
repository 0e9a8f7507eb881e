#include "train/step.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/trace.h"
#include "core/upload.h"
#include "dist/flight_recorder.h"
#include "nn/moe.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "optim/clip.h"

namespace minidl::train {

using dist::Action;
using dist::ActionKind;

int64_t count_targets(const Tensor& y) {
  int64_t n = 0;
  for (double v : y.to_vector()) n += v != -1.0;
  return n;
}

namespace {

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One step's execution state on a rank: the tensors of every (micro, chunk) between its forward and its backward,
// the posted receives and sends.
struct Executor {
  Executor(Stage& s, const StepOptions& options) : stage(s), o(options) {}
  Stage& stage;
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
    const trace::Span span("wait for peer");
    const auto t0 = std::chrono::steady_clock::now();
    work.wait();
    wait_ms += elapsed_ms(t0);
  }

  Tensor take(bool grad, int m, int v) {
    auto it = received.find({grad, m, v});
    MINIDL_ASSERT(it != received.end(), "pipeline: no receive posted for ", grad ? "gradient" : "activation", " m=", m,
                  " v=", v, " (the schedule was validated)");
    wait_for(*it->second.work);
    Tensor t = it->second.buffer;
    received.erase(it);
    return t;
  }

  void run(const Action& a) {
    // Every action but the step's end is a span (its waits for peers nested in it); the step's end only waits.
    std::optional<trace::Span> span;
    if (a.kind != ActionKind::kOptimizerStep) span.emplace(trace::enabled() ? dist::describe(a) : std::string());
    const int tag = a.peer >= 0 ? dist::message_tag(stage.spec(), a, stage.rank()) : 0;
    std::string label;
    if (a.peer >= 0) label = "pipeline ", label += dist::describe(a);
    const dist::CallSite site(std::move(label));
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        Posted p{Tensor::empty({micro, stage.positions_per_rank(T), stage.config().n_embd}, wire, device), nullptr};
        p.work = stage.pp_group()->recv(p.buffer, a.peer, tag);
        received[{a.kind == ActionKind::kRecvGrad, a.micro, a.chunk}] = p;
        break;
      }
      case ActionKind::kForward: {
        nn::GPT& chunk = stage.chunk(a.chunk);
        // Micro-batch m's dropout masks are those of its samples in one big batch (a recomputation in backward
        // pins the context it saw here: nn/gpt.cpp).
        stage.set_dropout(step, first_sample + a.micro * micro);
        Saved s;
        Tensor x;
        if (stage.global_chunk(a.chunk) == 0) {
          x = chunk.embed(ids.narrow(0, a.micro * micro, micro).to(device));
        } else {
          s.input = take(false, a.micro, a.chunk);
          s.input.set_requires_grad(true);
          x = s.input;
        }
        Tensor y = chunk.blocks(chunk.stage().first_block, chunk.stage().last_block, x);
        if (stage.is_last_chunk(a.chunk)) {
          Tensor loss = mul(chunk.head_loss(y, targets.narrow(0, a.micro * micro, micro).to(device), Reduction::kSum),
                            inv_targets);
          // Summed where the loss lives and read once after the step (on a GPU: one sync per step).
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
        sends.push_back({y, stage.pp_group()->send(y, a.peer, tag)});
        break;
      }
      case ActionKind::kBackward: {
        auto it = saved.find({a.micro, a.chunk});
        Saved s = it->second;
        saved.erase(it);
        // The chunk's last backward of the step launches its data-parallel buckets (DDP, ZeRO) while it runs.
        o.grad_sync->before_backward(a.chunk, a.micro + 1 == stage.spec().micro_batches);
        if (stage.is_last_chunk(a.chunk))
          s.output.backward();
        else
          s.output.backward(take(true, a.micro, a.chunk));
        if (s.input.defined()) saved[{a.micro, a.chunk}] = Saved{s.input, Tensor()};  // its gradient, to send
        break;
      }
      case ActionKind::kSendGrad: {
        auto it = saved.find({a.micro, a.chunk});
        Tensor g = it->second.input.grad().contiguous();
        MINIDL_ASSERT(g.dtype() == wire, "pipeline: expected a ", wire, " gradient between stages, got ", g.dtype());
        saved.erase(it);
        sends.push_back({g, stage.pp_group()->send(g, a.peer, tag)});
        break;
      }
      case ActionKind::kOptimizerStep:
        for (auto& s : sends) wait_for(*s.second);
        sends.clear();
        break;
    }
  }
};

// On a device, a host batch is range-checked on the host (GPT::check_ids: the same messages) and uploaded once as
// i64, the device kernels' index type, through pinned staging without a host wait (core/upload.h); returns whether
// the ids and targets the executor reads were checked that way (then ops::HostCheckedIndicesGuard spares the device
// ops a copy back per micro-batch).
bool select_inputs(Executor& ex, const data::Batch& batch) {
  ex.ids = batch.x;
  ex.targets = batch.y;
  if (ex.o.batch_checked) return true;  // a device batch drawn from a checked split (StepOptions::batch_checked)
  if (!ex.device.is_cuda() || !batch.x.device().is_cpu() || !batch.y.device().is_cpu()) return false;
  const nn::GPT& first = ex.stage.chunk(0);
  if (first.stage().embedding) {
    first.check_ids(batch.x, "token ids", false);
    ex.ids = upload_async(ops::cast(batch.x.contiguous(), DType::i64), ex.device);
  }
  const nn::GPT& last = ex.stage.chunk(ex.stage.chunk_count() - 1);
  if (last.stage().head) {
    last.check_ids(batch.y, "targets", true);
    ex.targets = upload_async(ops::cast(batch.y.contiguous(), DType::i64), ex.device);
  }
  return true;
}

// A mixture of experts' share of the step (nn/moe.h): each micro-batch's auxiliary loss (a mean over its sequences)
// weighs 1 / M of the step's objective, times the loss scale, as the cross-entropy does; DDP's average over the dp
// ranks makes it the mean over the global batch's sequences, one process's.
void set_aux_weight(Stage& stage, const StepOptions& o, int64_t micro_batches) {
  for (int v = 0; v < stage.chunk_count(); ++v) {
    nn::GPT& chunk = stage.chunk(v);
    if (!chunk.config().moe()) continue;
    const Tensor share = Tensor::full({}, 1.0 / double(micro_batches), DType::f32, stage.device());
    chunk.moe_context().aux_weight = o.scaler ? o.scaler->scale(share).detach() : share;
  }
}

}  // namespace

std::vector<nn::MoE::Load> balance_experts(Stage& stage) {
  std::vector<nn::MoE::Load> loads;
  dist::ProcessGroup* dp = stage.topology() ? &stage.topology()->dp_group() : nullptr;
  for (int v = 0; v < stage.chunk_count(); ++v)
    for (nn::MoE* moe : nn::moe_layers(stage.chunk(v))) {
      nn::MoE::Counts c = moe->take_counts();
      if (dp && dp->size() > 1) {  // routed | kept, in one all-reduce
        std::vector<double> both = c.routed;
        both.insert(both.end(), c.kept.begin(), c.kept.end());
        both =
            sum_over(*dp, Tensor::from_vector(both, {int64_t(both.size())}, DType::f64).to(dp->device())).to_vector();
        const auto half = both.begin() + int64_t(c.routed.size());
        c = {{both.begin(), half}, {half, both.end()}};
      }
      loads.push_back(moe->finish_step(c));
    }
  return loads;
}

Tensor forward_backward(Stage& stage, const data::Batch& whole, const StepOptions& o) {
  // Context parallelism: this rank's positions of every sequence, the targets split as the inputs are (the
  // sampler shifted them, y = x + 1, on the whole sequence: shifting a chunk would pair its last input with a
  // token of the next chunk that is not there).
  const int cp = stage.context_parallel_size();
  const data::Batch batch = cp > 1 ? data::Batch{stage.positions_of(whole.x), stage.positions_of(whole.y)} : whole;
  const int64_t rows = batch.x.size(0), M = stage.spec().micro_batches;
  MINIDL_CHECK(o.grad_sync,
               "train_step: StepOptions::grad_sync is null; one process is GradSync::one_process(), "
               "its default");
  MINIDL_CHECK(rows % M == 0, "train_step: a batch of ", rows, " sequences does not split into ", M,
               " equal micro-batches (--micro-batches)");
  MINIDL_CHECK(o.amp == DType::f32 || ops::is_half(o.amp), "train_step: amp must be f32 (off), bf16 or f16, got ",
               o.amp);
  Executor ex(stage, o);
  ex.micro = rows / M;
  ex.T = batch.x.size(1);
  // The normaliser of the whole step. Under DDP each rank divides by its own slice's count and DDP averages over
  // ranks: with equal-sized slices and no ignored targets that is the global mean exactly. A context-parallel rank
  // holds 1/cp of its sequences' targets and divides by the whole sequences' count over cp: the average over the
  // cp ranks is then the sequences' sum over their count, wherever the ignored (-1) targets fall.
  ex.inv_targets =
      double(cp) / double(std::max<int64_t>(1, o.target_count >= 0 ? o.target_count : count_targets(whole.y)));
  ex.step = stage.dropout_step();
  ex.first_sample = stage.dropout_first_sample();
  ex.device = stage.device();
  ex.wire = o.amp;
  set_aux_weight(stage, o, M);
  std::optional<ops::HostCheckedIndicesGuard> checked;
  if (select_inputs(ex, batch)) checked.emplace();
  {
    MemoryTagGuard tag(MemTag::kActivations);
    // One guard over the whole schedule: the 16-bit weight copies are made once per step (autograd/autocast.h).
    std::optional<autograd::AutocastGuard> autocast;
    if (o.amp != DType::f32) autocast.emplace(o.amp);
    const auto t0 = std::chrono::steady_clock::now();
    {
      // The window the measured bubble divides by (Stage::Timing): a trace reads the bubble off it too.
      const trace::Span span("schedule");
      for (const Action& a : stage.schedule().ranks[size_t(stage.rank())]) ex.run(a);
    }
    Stage::Timing& timing = stage.timing();
    timing.schedule_ms += elapsed_ms(t0);
    timing.wait_ms += ex.wait_ms;
    timing.steps += 1;
    o.grad_sync->after_backward();
  }
  stage.set_dropout(ex.step + 1, ex.first_sample);
  return ex.loss_sum;
}

StepResult train_step(Stage& stage, optim::Optimizer& optimizer, const data::Batch& batch, const StepOptions& o) {
  StepResult r;
  const Device device = stage.device();
  if (o.scaler && device.is_cuda()) {
    o.scaler->keep_state_on(device);  // the scale stays there (apply_step)
    r.loss_scale = NAN;
    r.on_device.loss_scale = o.scaler->scale(Tensor::ones({}, DType::f32, device)).detach();
  } else {
    r.loss_scale = o.scaler ? o.scaler->current_scale() : 1.0;
  }
  Tensor loss_sum = forward_backward(stage, batch, o);
  r.experts = balance_experts(stage);
  dist::ProcessGroup* pp = stage.pp_group();
  if (!device.is_cuda()) {
    // The loss exists on the last stage: share it (zeros elsewhere, so the sum is exact).
    r.loss = loss_sum.defined() ? loss_sum.item() : 0.0;
    if (pp) r.loss = sum_over(*pp, r.loss);
  } else {
    r.loss = NAN;
    // Shared by an all-reduce on the device, zeros on the stages without the loss: x + 0 is x, so the value read
    // back is the last stage's f32 sum.
    if (pp && pp->size() > 1)
      loss_sum = sum_over(*pp, loss_sum.defined() ? ops::cast(loss_sum, DType::f32).reshape({}).contiguous()
                                                  : Tensor::zeros({}, DType::f32, device));
    r.on_device.loss = loss_sum;
  }
  // The gradients this rank owns: every parameter's, or (ZeRO) its shard's.
  const std::vector<Tensor> params = stage.parameters();
  return apply_step(optimizer, o.grad_sync->owned_params(params), o, std::move(r));
}

StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, const data::Batch& batch, const StepOptions& o) {
  Stage stage = Stage::of(model, int(o.micro_batches));
  return train_step(stage, optimizer, batch, o);
}

void StepResult::read() {
  if (!pending()) return;
  if (on_device.loss.defined()) loss = on_device.loss.item();
  const bool overflow = on_device.found_inf.defined() && on_device.found_inf.item() != 0;
  grad_norm = overflow ? INFINITY : std::sqrt(on_device.grad_norm_squared.item());
  applied = !overflow;
  skip_reason = overflow ? "inf/nan in gradients" : "";
  if (on_device.loss_scale.defined()) loss_scale = on_device.loss_scale.item();
  on_device = {};
}

namespace {

// apply_step on a CUDA device: the same steps with every decision taken on the device (optim/clip.h,
// optim/grad_scaler.h, Optimizer::step_unless), so nothing is read back.
StepResult apply_step_on_device(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& o,
                                StepResult r, Device device) {
  if (o.scaler) {
    o.scaler->keep_state_on(device);
    o.scaler->combine_overflow_on_device = [sync = o.grad_sync](const Tensor& f) {
      sync->combine_overflow_on_device(f);
    };
    r.on_device.found_inf = o.scaler->unscale_(params);
  }
  // With an overflow the norm is inf or NaN and the clip multiplies by 0 or nothing: the step is skipped anyway.
  r.on_device.grad_norm_squared = o.grad_sync->grad_norm_squared_on_device(params, device);
  if (o.grad_clip > 0) optim::clip_grads_by(params, r.on_device.grad_norm_squared, o.grad_clip);
  optimizer.set_lr(o.lr);
  if (o.scaler)
    o.scaler->step(optimizer);
  else
    optimizer.step();
  o.grad_sync->after_step();
  optimizer.zero_grad();
  if (o.read_back) r.read();
  return r;
}

}  // namespace

StepResult apply_step(optim::Optimizer& optimizer, const std::vector<Tensor>& params, const StepOptions& o,
                      StepResult r) {
  const trace::Span span("optimizer");
  MINIDL_CHECK(o.grad_sync, "apply_step: StepOptions::grad_sync is null; one process is GradSync::one_process()");
  if (!params.empty() && params.front().device().is_cuda())
    return apply_step_on_device(optimizer, params, o, std::move(r), params.front().device());
  if (o.scaler)  // every rank skips the step when any rank that holds gradients overflowed
    o.scaler->combine_overflow = [sync = o.grad_sync](bool local) { return sync->combine_overflow(local); };
  bool overflow = o.scaler && o.scaler->unscale_and_check(params);
  r.grad_norm = overflow ? INFINITY : std::sqrt(o.grad_sync->grad_norm_squared(params));
  if (o.grad_clip > 0 && !overflow) {
    double factor = optim::clip_factor(r.grad_norm, o.grad_clip);
    if (factor < 1.0) optim::scale_grads(params, factor);
  }
  optimizer.set_lr(o.lr);
  if (o.scaler) {
    optim::ScalerStep s = o.scaler->step(optimizer);
    r.applied = s.applied;
    r.skip_reason = s.reason;
    optimizer.zero_grad();
  } else {
    optimizer.step_and_zero_grad();  // after_step gathers parameters only: the gradients may go first
  }
  o.grad_sync->after_step();
  return r;
}

data::DeviceBatchSampler device_sampler(const nn::GPT& model, const std::vector<int32_t>& split, int64_t seq,
                                        int64_t global_batch, uint64_t seed) {
  model.check_ids(Tensor::from_vector(split, {int64_t(split.size())}, DType::i32), "token ids of the training split",
                  false);
  return data::DeviceBatchSampler(split, seq, global_batch, seed, model.parameters().front().device());
}

data::Batch draw_checked(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n,
                         StepOptions& options) {
  options.target_count = n * sampler.seq();  // a checked split has no ignored (-1) target
  options.batch_checked = true;
  return sampler.batch(step, begin, n);
}

StepResult train_step(nn::GPT& model, optim::Optimizer& optimizer, data::DeviceBatchSampler& sampler, int64_t step,
                      int64_t begin, int64_t n, StepOptions options) {
  const data::Batch batch = draw_checked(sampler, step, begin, n, options);
  return train_step(model, optimizer, batch, options);
}

}  // namespace minidl::train
