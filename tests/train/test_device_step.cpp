// The second half of a training step on the device without host round trips (issue #15): the global gradient
// norm and the clip (ops/grad_norm.h), the fp16 overflow decision and the loss scale (ops/unscale.h,
// optim::GradScaler::keep_state_on) and AdamW's skip on the device's flag (ops::fused_adamw_multi_unless_), through
// train::train_step / apply_step with StepOptions::read_back false. Oracles: the backend's counters (nothing read
// back), the host-side computation of the same step (the norm summed in double on the host, the clip factor
// max / (norm + 1e-6), GradScaler's rules on the host) and the CPU run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/cuda/cuda_test.h"
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/tensor.h"
#include "nn/gpt.h"
#include "ops/adamw.h"
#include "ops/grad_norm.h"
#include "ops/unscale.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "train/step.h"
#include "train/tiny_batches.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);
const nn::GPTConfig kConfig{17, 8, 2, 2, 32, 0.0, true};

class DeviceStep : public testing::CudaTest {};

// `rows` sequences, ids and targets both shifted by `shift`.
data::Batch tiny_batch(int64_t rows = 2, int shift = 0) { return testing::tiny_batch(rows, shift, shift); }

using testing::weights;

// ||a - b|| / ||b||: a few AdamW elements whose gradient is near eps turn a last-bit difference of the clip factor
// into a visible one, so whole vectors are compared, not elements.
double relative_distance(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  return std::sqrt(diff / norm);
}

// An optimizer that changes nothing and keeps a host copy of the gradients it was given (after unscale and clip).
class Recorder final : public optim::Optimizer {
 public:
  explicit Recorder(std::vector<Tensor> params) : Optimizer({{std::move(params), 0.0}}, 1.0, "Recorder") {}
  void step() override {
    grads.clear();
    for (const optim::ParamGroup& g : param_groups())
      for (const Tensor& p : g.params) {
        std::vector<double> v = p.grad().to(Device::cpu()).to_vector();
        grads.insert(grads.end(), v.begin(), v.end());
      }
  }
  std::vector<double> grads;
};

// The clip on the device scales by max / (norm + 1e-6) with the norm of the gradients, summed in double on the host.
TEST_F(DeviceStep, ClipOnTheDeviceMatchesTheHostFormula) {
  nn::GPT model(kConfig, 1337);
  model.to(kCuda);
  model.train();
  Recorder rec(model.parameters());
  const data::Batch batch = tiny_batch();
  train::StepOptions o;
  o.grad_clip = 0;  // the unclipped gradients first (Recorder leaves the weights alone)
  train::StepResult unclipped = train::train_step(model, rec, batch, o);
  const std::vector<double> g = rec.grads;
  double sq = 0;
  for (double v : g) sq += v * v;
  EXPECT_NEAR(unclipped.grad_norm, std::sqrt(sq), 1e-6 * std::sqrt(sq));

  o.grad_clip = 0.25 * std::sqrt(sq);  // clipping active
  o.read_back = false;
  train::StepResult clipped = train::train_step(model, rec, batch, o);
  ASSERT_TRUE(clipped.pending());
  clipped.read();
  EXPECT_NEAR(clipped.grad_norm, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_EQ(clipped.loss, unclipped.loss);
  const float factor = float(o.grad_clip / (clipped.grad_norm + 1e-6));
  ASSERT_EQ(rec.grads.size(), g.size());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(float(rec.grads[i]), float(g[i]) * factor) << "element " << i;

  // The op itself, against the CPU: the same norm, and nothing clipped when the norm is under max_norm.
  Tensor a = Tensor::from_vector(std::vector<float>{3, 4, 0, 1e-3f}, {4});
  Tensor sq_cpu = ops::grad_norm_squared_multi({a}, Device::cpu());
  Tensor da = a.to(kCuda);
  Tensor sq_dev = ops::grad_norm_squared_multi({da}, kCuda);
  EXPECT_EQ(sq_dev.to_vector(), sq_cpu.to_vector());
  ops::clip_grads_multi_({da}, sq_dev, 10.0);
  EXPECT_EQ(da.to_vector(), a.to_vector());
  ops::clip_grads_multi_({da}, sq_dev, 1.0);
  ops::clip_grads_multi_({a}, sq_cpu, 1.0);
  EXPECT_EQ(da.to_vector(), a.to_vector());
  EXPECT_NEAR(a.to_vector()[1], 4.0 / (5.0 + 1e-6), 1e-7);
}

// A steady-state step through train_step with clipping, in f32, bf16 autocast and fp16 with loss scaling: on a step
// whose numbers are not read back, the host never waits, nothing is read back, nothing is cudaMalloc'ed, and the
// one thing that crosses to the device is the batch: ids and targets as i64, each one asynchronous copy from
// pinned staging (core/upload.h). The "0 host<->device copies" means "none besides the batch", which a
// step cannot do without (docs/decisions.md, "No host round trips in a device step").
TEST_F(DeviceStep, SteadyStateTrainStepWithClipAndFp16MakesNoRoundTrip) {
  for (const DType amp : {DType::f32, DType::bf16, DType::f16}) {
    const bool fp16 = amp == DType::f16;
    SCOPED_TRACE(dtype_name(amp));
    nn::GPT model(kConfig, 1337);
    model.to(kCuda);
    model.train();
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
    optim::GradScaler scaler;
    train::StepOptions o;
    o.grad_clip = 0.05;  // below the norm: the clip is applied
    o.read_back = false;
    o.amp = amp;
    if (fp16) o.scaler = &scaler;
    const data::Batch batch = tiny_batch();
    train::train_step(model, opt, batch, o);
    train::train_step(model, opt, batch, o);  // the allocator's cache is warm
    const cuda::Counters before = cuda::counters();
    train::StepResult r = train::train_step(model, opt, batch, o);
    const cuda::Counters c = cuda::counters() - before;
    EXPECT_EQ(c.device_mallocs, 0);
    EXPECT_EQ(c.d2h_copies, 0);
    EXPECT_EQ(c.h2d_copies, 2);                       // ids and targets
    EXPECT_EQ(c.h2d_bytes, 2 * batch.x.numel() * 8);  // as i64
    EXPECT_EQ(c.host_syncs, 0);  // the uploads go through pinned staging buffers (core/cuda/staging.cpp)
    EXPECT_GT(c.kernel_launches, 0);
    ASSERT_TRUE(r.pending());
    r.read();
    EXPECT_TRUE(std::isfinite(r.loss));
    EXPECT_GT(r.grad_norm, o.grad_clip);
    EXPECT_TRUE(r.applied);
    if (fp16) {
      EXPECT_EQ(r.loss_scale, 65536.0);
      EXPECT_EQ(scaler.current_scale(), 65536.0);
      EXPECT_EQ(opt.state().step, 3);
    }
  }
}

// The previous, host-side implementation of a clipped (and with fp16, loss-scaled) AdamW step: the norm read on
// the host, the factor applied from the host, the scaler's decision taken on the host and AdamW's step count
// kept there.
std::vector<double> host_side_losses(nn::GPT& model, optim::AdamW& opt, optim::GradScaler* scaler, DType amp,
                                     double clip, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const data::Batch b = tiny_batch(2, s);
    Tensor loss;
    {
      std::optional<autograd::AutocastGuard> autocast;
      if (amp != DType::f32) autocast.emplace(amp);
      loss = mul(model.loss(b.x, b.y, Reduction::kSum), 1.0 / 16);
      losses.push_back(loss.item());
      if (scaler) loss = scaler->scale(loss);
      loss.backward();
    }
    const std::vector<Tensor> params = model.parameters();
    const bool overflow = scaler && scaler->unscale_and_check(params);
    if (!overflow) {  // the norm's value read back (the kernel's sum is checked against the host's above)
      std::vector<Tensor> grads;
      for (const Tensor& p : params) grads.push_back(p.grad());
      const double norm = std::sqrt(ops::grad_norm_squared_multi(grads, grads[0].device()).item());
      const double factor = optim::clip_factor(norm, clip);
      if (factor < 1.0) optim::scale_grads(params, factor);
    }
    opt.set_lr(1e-2);
    if (scaler)
      scaler->step(opt);
    else
      opt.step();
    opt.zero_grad();
  }
  return losses;
}

// N clipped steps with the decisions on the device equal the host-side implementation on the same device bit for
// bit, and the CPU run within the device's tolerance, in f32 and in fp16 with a loss scaler.
TEST_F(DeviceStep, DeviceDecisionsMatchHostSideAndCpu) {
  constexpr int kSteps = 4;
  for (const bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16" : "f32");
    const DType amp = fp16 ? DType::f16 : DType::f32;
    auto device_run = [&](Device device, std::vector<double>& w) {
      nn::GPT model(kConfig, 1337);
      model.to(device);
      model.train();
      optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-2});
      optim::GradScaler scaler;
      train::StepOptions o;
      o.lr = 1e-2;
      o.grad_clip = 0.05;
      o.read_back = false;
      o.amp = amp;
      o.scaler = fp16 ? &scaler : nullptr;
      std::vector<double> losses;
      for (int s = 0; s < kSteps; ++s) {
        train::StepResult r = train::train_step(model, opt, tiny_batch(2, s), o);
        r.read();
        EXPECT_GT(r.grad_norm, o.grad_clip) << "step " << s;
        losses.push_back(r.loss);
      }
      w = weights(model);
      return losses;
    };
    std::vector<double> w_dev, w_cpu, w_ref;
    const std::vector<double> dev = device_run(kCuda, w_dev);
    const std::vector<double> cpu = device_run(Device::cpu(), w_cpu);

    nn::GPT model(kConfig, 1337);
    model.to(kCuda);
    model.train();
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-2});
    optim::GradScaler scaler;
    const std::vector<double> ref = host_side_losses(model, opt, fp16 ? &scaler : nullptr, amp, 0.05, kSteps);
    w_ref = weights(model);
    EXPECT_EQ(dev, ref);
    EXPECT_EQ(w_dev, w_ref);
    for (int s = 0; s < kSteps; ++s)
      EXPECT_NEAR(dev[size_t(s)], cpu[size_t(s)], 1e-3 * std::abs(cpu[size_t(s)])) << "step " << s;
    EXPECT_LE(relative_distance(w_dev, w_cpu), 1e-2);
  }
}

// A planted inf in one gradient under fp16 loss scaling: the step is skipped (weights and AdamW's moments and
// step count unchanged), the scale halves, and the next clean step applies with the right bias correction; on
// the CPU (host-side decision) and on the device (nothing read back), with the same results.
TEST_F(DeviceStep, Fp16OverflowSkipsTheStepOnCpuAndDevice) {
  std::vector<double> final_weights[2];
  for (const Device device : {Device::cpu(), kCuda}) {
    SCOPED_TRACE(device.is_cpu() ? "cpu" : "cuda");
    nn::GPT model(kConfig, 1337);
    model.to(device);
    model.train();
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-2});
    optim::GradScaler scaler;
    train::StepOptions o;
    o.lr = 1e-2;
    o.grad_clip = 1.0;
    o.amp = DType::f16;
    o.scaler = &scaler;
    o.read_back = false;
    // One step by hand so that an inf can be planted between backward and apply_step.
    auto step = [&](bool plant, int shift) {
      const data::Batch b = tiny_batch(2, shift);
      {
        autograd::AutocastGuard autocast(DType::f16);
        Tensor loss = scaler.scale(mul(model.loss(b.x, b.y, Reduction::kSum), 1.0 / 16));
        loss.backward();
      }
      if (plant) model.parameters()[3].grad().narrow(0, 0, 1).fill_(INFINITY);
      const cuda::Counters before = cuda::counters();
      train::StepResult r = train::apply_step(opt, model.parameters(), o, {});
      if (device.is_cuda()) {
        const cuda::Counters c = cuda::counters() - before;
        EXPECT_EQ(c.d2h_copies + c.host_syncs, 0);
      }
      r.read();
      return r;
    };
    if (device.is_cuda()) scaler.keep_state_on(device);
    EXPECT_TRUE(step(false, 0).applied);
    const std::vector<double> before = weights(model);
    const std::vector<double> m_before = opt.state().m.to(Device::cpu()).to_vector();
    train::StepResult skipped = step(true, 1);
    EXPECT_FALSE(skipped.applied);
    EXPECT_EQ(skipped.skip_reason, "inf/nan in gradients");
    EXPECT_TRUE(std::isinf(skipped.grad_norm));
    EXPECT_EQ(weights(model), before);  // bit for bit
    EXPECT_EQ(opt.state().m.to(Device::cpu()).to_vector(), m_before);
    EXPECT_EQ(opt.state().step, 1);
    EXPECT_EQ(scaler.current_scale(), 32768.0);
    EXPECT_EQ(scaler.skipped_steps(), 1);
    EXPECT_TRUE(step(false, 2).applied);
    EXPECT_EQ(opt.state().step, 2);
    EXPECT_EQ(scaler.state().clean_steps, 1);
    final_weights[device.is_cpu() ? 0 : 1] = weights(model);
  }
  EXPECT_LE(relative_distance(final_weights[1], final_weights[0]), 1e-2);
}

// The fused AdamW that skips on a flag, on the CPU and on the device: a set flag leaves everything alone and
// counts the skip; a clear one steps with the bias correction of step - skipped.
TEST_F(DeviceStep, AdamWUnlessFoundInf) {
  for (const Device device : {Device::cpu(), kCuda}) {
    SCOPED_TRACE(device.is_cpu() ? "cpu" : "cuda");
    auto t = [&](std::vector<float> v) { return Tensor::from_vector(v, {int64_t(v.size())}).to(device); };
    Tensor p = t({1, 2, 3}), g = t({0.5f, -1, 2}), m = t({0, 0, 0}), v = t({0, 0, 0});
    Tensor rp = t({1, 2, 3}), rm = t({0, 0, 0}), rv = t({0, 0, 0});
    Tensor skipped = Tensor::zeros({1}, DType::i64).to(device);
    ops::AdamWHyper h{1e-2, 0.9, 0.999, 1e-8, 0.1, 1};
    ops::fused_adamw_multi_unless_({p}, {g}, {m}, {v}, h, Tensor::ones({1}, DType::i32).to(device), skipped, true);
    EXPECT_EQ(p.to_vector(), rp.to_vector());
    EXPECT_EQ(skipped.to_vector(), std::vector<double>{1});
    h.step = 2;  // the second call, the first step taken: bias correction of step 1
    ops::fused_adamw_multi_unless_({p}, {g}, {m}, {v}, h, Tensor::zeros({1}, DType::i32).to(device), skipped, true);
    ops::AdamWHyper first = h;
    first.step = 1;
    ops::fused_adamw_multi_({rp}, {g}, {rm}, {rv}, first);
    EXPECT_EQ(p.to_vector(), rp.to_vector());
    EXPECT_EQ(m.to_vector(), rm.to_vector());
    EXPECT_EQ(skipped.to_vector(), std::vector<double>{1});
  }
}

// The scaler's rules on the device against GradScaler on the host, over a pattern of clean and overflowing steps
// that grows, backs off with hysteresis and hits both bounds.
TEST_F(DeviceStep, LossScaleRulesOnTheDeviceMatchTheHost) {
  optim::GradScalerOptions opt;
  opt.init_scale = 8;
  opt.growth_interval = 2;
  opt.hysteresis = 2;
  opt.min_scale = 1;
  opt.max_scale = 32;
  optim::GradScaler host(opt);
  Recorder none({Tensor::zeros({1}).set_requires_grad(true)});
  const std::vector<double> init{opt.init_scale, 0, double(opt.hysteresis), 0};
  Tensor state = Tensor::from_vector(init, {4}, DType::f64).to(kCuda);
  Tensor scale = Tensor::full({1}, opt.init_scale, DType::f32, kCuda);
  const ops::LossScaleRules rules{opt.growth_factor, opt.backoff_factor,  opt.min_scale,
                                  opt.max_scale,     opt.growth_interval, opt.hysteresis};
  const char* pattern = "cccccccxcxxxxxxxccxcccc";
  for (const char* c = pattern; *c; ++c) {
    const bool overflow = *c == 'x';
    Tensor g = none.param_groups()[0].params[0];
    g.set_grad(Tensor::full({1}, overflow ? INFINITY : 1.0));
    host.step(none);
    ops::update_loss_scale_(state, scale, Tensor::full({1}, overflow ? 1 : 0, DType::i32, kCuda), rules);
    const optim::GradScalerState want = host.state();
    EXPECT_EQ(state.to_vector(), (std::vector<double>{want.scale, double(want.clean_steps), double(want.overflows_left),
                                                      double(want.skipped_steps)}))
        << "after step " << c - pattern;
    EXPECT_EQ(scale.to_vector()[0], want.scale);
  }
}

}  // namespace
}  // namespace minidl