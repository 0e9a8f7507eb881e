// GradScaler: the scale follows its rules (growth, backoff, hysteresis, bounds) over random overflow sequences,
// checked against a reference model written here; a skipped step leaves weights and AdamW state bitwise
// untouched; the overflow flag goes through combine_overflow; state round-trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/functions.h"
#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"

using namespace minidl;
using optim::GradScaler;
using optim::GradScalerOptions;

namespace {

// The rules of optim/grad_scaler.h, restated independently.
struct ReferenceScaler {
  GradScalerOptions o;
  double scale;
  int64_t clean = 0, budget, skipped = 0;
  explicit ReferenceScaler(const GradScalerOptions& opt) : o(opt), scale(opt.init_scale), budget(opt.hysteresis) {}
  void step(bool overflow) {
    if (overflow) {
      ++skipped;
      clean = 0;
      if (budget > 0) --budget;
      if (budget == 0) scale = std::max(o.min_scale, scale * o.backoff_factor);
    } else if (++clean == o.growth_interval) {
      clean = 0;
      budget = o.hysteresis;
      scale = std::min(o.max_scale, scale * o.growth_factor);
    }
  }
};

// One parameter whose gradient we set by hand, with an optimizer over it.
struct OneParam {
  Tensor p = Tensor::full({5}, 0.5).set_requires_grad(true);
  optim::AdamW adamw{{{{p}, 0.1}}, {.lr = 1e-2}};
  void set_grad(double value, bool overflow) {
    Tensor g = Tensor::full({5}, value);
    if (overflow) g.data<float>()[3] = INFINITY;
    p.set_grad(g);
  }
};

std::vector<uint8_t> bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

}  // namespace

TEST(GradScaler, DefaultsAreTheDocumentedOnes) {
  GradScaler s;
  EXPECT_EQ(s.current_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().hysteresis, 1);
}

TEST(GradScaler, MatchesTheReferenceOverRandomOverflowSequences) {
  const GradScalerOptions settings[] = {
      {},  // defaults: 2^16, x2 / 2000, x0.5, hysteresis 1
      {.init_scale = 1024, .growth_interval = 3, .hysteresis = 1, .min_scale = 1, .max_scale = 4096},
      {.init_scale = 8,
       .growth_factor = 4,
       .backoff_factor = 0.25,
       .growth_interval = 5,
       .hysteresis = 3,
       .min_scale = 0.5,
       .max_scale = 1 << 20},
      {.init_scale = 2, .growth_interval = 1, .hysteresis = 2, .min_scale = 1, .max_scale = 64},
  };
  int case_id = 0;
  for (const GradScalerOptions& o : settings) {
    for (double p_overflow : {0.0, 0.02, 0.3, 0.9}) {
      ++case_id;
      OneParam s;
      GradScaler scaler(o);
      ReferenceScaler ref(o);
      Philox rng(uint64_t(case_id), 9);
      for (int step = 0; step < 3000; ++step) {
        bool overflow = rng.uniform(uint64_t(step)) < p_overflow;
        s.set_grad(0.01 * scaler.current_scale(), overflow);
        optim::ScalerStep r = scaler.step(s.adamw);
        ASSERT_EQ(r.applied, !overflow) << "case " << case_id << " step " << step;
        ASSERT_EQ(r.scale, ref.scale) << "case " << case_id << " step " << step;
        ref.step(overflow);
        ASSERT_EQ(scaler.current_scale(), ref.scale) << "case " << case_id << " step " << step;
        ASSERT_EQ(r.next_scale, ref.scale);
        ASSERT_EQ(scaler.state().clean_steps, ref.clean);
        ASSERT_EQ(scaler.state().overflows_left, ref.budget);
        ASSERT_EQ(scaler.skipped_steps(), ref.skipped);
        ASSERT_GE(scaler.current_scale(), o.min_scale);
        ASSERT_LE(scaler.current_scale(), o.max_scale);
        if (overflow) ASSERT_EQ(r.reason, "inf/nan in gradients");
      }
    }
  }
}

TEST(GradScaler, HysteresisToleratesOverflowsBeforeBackingOff) {
  OneParam s;
  GradScaler scaler({.init_scale = 64, .growth_interval = 100, .hysteresis = 3});
  for (double want : {64.0, 64.0, 32.0, 16.0}) {  // 2 tolerated, then every overflow backs off
    s.set_grad(1.0, true);
    scaler.step(s.adamw);
    EXPECT_EQ(scaler.current_scale(), want);
  }
}

TEST(GradScaler, SkippedStepLeavesWeightsAndAdamWStateBitwiseUntouched) {
  OneParam s;
  GradScaler scaler({.init_scale = 4});
  s.set_grad(0.3 * 4, false);
  ASSERT_TRUE(scaler.step(s.adamw).applied);  // state exists and is non-zero
  const auto p0 = bytes(s.p), m0 = bytes(s.adamw.state().m), v0 = bytes(s.adamw.state().v);
  const int64_t t0 = s.adamw.state().step;
  for (bool nan : {false, true}) {
    s.set_grad(0.3, true);
    if (nan) s.p.grad().data<float>()[0] = NAN;
    optim::ScalerStep r = scaler.step(s.adamw);
    EXPECT_FALSE(r.applied);
    EXPECT_EQ(bytes(s.p), p0);
    EXPECT_EQ(bytes(s.adamw.state().m), m0);
    EXPECT_EQ(bytes(s.adamw.state().v), v0);
    EXPECT_EQ(s.adamw.state().step, t0);
  }
  s.set_grad(0.3, false);
  EXPECT_TRUE(scaler.step(s.adamw).applied);
  EXPECT_NE(bytes(s.p), p0);
  EXPECT_EQ(s.adamw.state().step, t0 + 1);
}

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradients) {
  OneParam s;
  GradScaler scaler({.init_scale = 1024});
  Tensor loss = sum(mul(s.p, 3.0));
  EXPECT_EQ(scaler.scale(loss).item(), loss.item() * 1024);
  scaler.scale(loss).backward();
  EXPECT_FALSE(scaler.unscale_and_check({s.p}));
  for (double g : s.p.grad().to_vector()) EXPECT_EQ(g, 3.0);  // exact: the scale is a power of two
  EXPECT_THROW(scaler.unscale_and_check({s.p}), Error);       // once per step
  EXPECT_TRUE(scaler.step(s.adamw).applied);                  // uses the result above, no second unscale
}

TEST(GradScaler, OverflowFlagGoesThroughCombineOverflow) {
  OneParam s;
  GradScaler scaler({.init_scale = 16});
  int calls = 0;
  scaler.combine_overflow = [&](bool local) {  // as if another rank saw an inf
    ++calls;
    EXPECT_FALSE(local);
    return true;
  };
  s.set_grad(1.0, false);
  optim::ScalerStep r = scaler.step(s.adamw);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(scaler.current_scale(), 8.0);
}

TEST(GradScaler, StateRoundTripsAndIsValidated) {
  OneParam s;
  GradScaler a({.init_scale = 256, .growth_interval = 4, .hysteresis = 2});
  for (int i = 0; i < 7; ++i) {
    s.set_grad(1.0, i == 2 || i == 3);
    a.step(s.adamw);
  }
  GradScaler b({.init_scale = 256, .growth_interval = 4, .hysteresis = 2});
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_THROW(b.load_state({.scale = 1e30}), Error);
  EXPECT_THROW(b.load_state({.scale = 2, .clean_steps = -1}), Error);
}

TEST(GradScaler, RejectsBadOptions) {
  EXPECT_THROW(GradScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.backoff_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), Error);
  EXPECT_THROW(GradScaler({.hysteresis = 0}), Error);
  EXPECT_THROW(GradScaler({.init_scale = 0.5, .min_scale = 1}), Error);
}
