// bench_gpu_roofline's cost model (bench/roofline.h): the model FLOPs of its kernel list equal nanoGPT's
// estimate that nn::GPT::flops_per_token implements (6N + 12·L·C·T per token), and a kernel's ideal time is the
// larger of its compute and memory times.
#include <gtest/gtest.h>

#include "bench/roofline.h"
#include "nn/gpt.h"

namespace minidl {
namespace {

void expect_step_flops_match_the_model(const bench::RooflineConfig& c) {
  nn::GPT model(nn::GPTConfig{c.vocab, c.seq, c.layers, c.heads, c.embd, 0.0, true}, 1);
  const double expected = model.flops_per_token(c.seq) * double(c.batch * c.seq);
  EXPECT_NEAR(bench::step_flops(bench::step_kernels(c)), expected, expected * 1e-12);
}

TEST(Roofline, StepFlopsAreTheModelsFlopsPerToken) {
  expect_step_flops_match_the_model({4, 4, 128, 64, 12, 65, DType::f32});   // the baby config
  expect_step_flops_match_the_model({6, 6, 384, 256, 8, 65, DType::bf16});  // nanoGPT's Shakespeare config
  expect_step_flops_match_the_model({2, 3, 48, 17, 3, 101, DType::f16});    // ragged sizes
}

TEST(Roofline, Gpt2OnH100IsBoundedByTheTensorCoresAndItsLargestKernelsAreGemms) {
  bench::RooflineConfig c;  // GPT-2 124M, B 16, T 1024, bf16
  c.kernels = bench::KernelSet::kTarget;
  const bench::GpuPeak& h100 = *bench::find_gpu("H100");
  double seconds = 0;
  int fc = 0, adamw = 0;  // each checked kernel must be in the list: a renamed one would otherwise check nothing
  for (const bench::KernelCost& k : bench::step_kernels(c)) {
    seconds += bench::ideal_seconds(k, h100, c.amp);
    if (k.name == "linear fc fwd") {
      ++fc;
      EXPECT_TRUE(bench::compute_bound(k, h100, c.amp));
    }
    if (k.name == "AdamW") {
      ++adamw;
      EXPECT_FALSE(bench::compute_bound(k, h100, c.amp));
    }
  }
  EXPECT_EQ(fc, 1);
  EXPECT_EQ(adamw, 1);
  const double compute_only = bench::step_flops(bench::step_kernels(c)) / bench::peak_flops(h100, c.amp);
  EXPECT_GT(seconds, compute_only);
  EXPECT_LT(seconds, 2 * compute_only);
  EXPECT_EQ(bench::find_gpu("V100"), nullptr);
}

// The three kernel sets of issue #15 do the same arithmetic; each step towards the target moves fewer bytes and has
// a lower bound no higher than the one before (kNow has reached kTarget). f32 runs the same kernels in all three but
// for the residual add fused into ln_2, the MLP's GELU in the GEMM epilogues and the vocabulary padded to a
// multiple of 64, all from kNow on (the padding's 47 rows of 50304
// cost < 0.5% in a roofline, which cannot see what aligned rows gain; the fused add saves more).
TEST(Roofline, KernelSetsDoTheSameFlopsAndEachStepLowersTheBound) {
  const bench::GpuPeak& h100 = *bench::find_gpu("H100");
  auto bound = [&](bench::RooflineConfig c, bench::KernelSet set, double* flops) {
    c.kernels = set;
    double seconds = 0;
    for (const bench::KernelCost& k : bench::step_kernels(c)) seconds += bench::ideal_seconds(k, h100, c.amp);
    *flops = bench::step_flops(bench::step_kernels(c));
    return seconds;
  };
  for (DType amp : {DType::bf16, DType::f16}) {
    bench::RooflineConfig c;
    c.amp = amp;
    double f_before, f_now, f_target;
    const double before = bound(c, bench::KernelSet::kBefore, &f_before);
    const double now = bound(c, bench::KernelSet::kNow, &f_now);
    const double target = bound(c, bench::KernelSet::kTarget, &f_target);
    EXPECT_EQ(f_before, f_target);
    EXPECT_EQ(f_now, f_target);
    EXPECT_GT(before, now);
    EXPECT_EQ(now, target);  // the last step, the MLP's GELU in the GEMM epilogues, is taken
  }
  bench::RooflineConfig f32;
  f32.amp = DType::f32;
  double unused;
  // f32: the same kernels but for the residual add fused into ln_2, the padded head and the GELU in the GEMM
  // epilogues, since kNow.
  EXPECT_GT(bound(f32, bench::KernelSet::kBefore, &unused), bound(f32, bench::KernelSet::kNow, &unused));
  EXPECT_EQ(bound(f32, bench::KernelSet::kNow, &unused), bound(f32, bench::KernelSet::kTarget, &unused));
}

// The padded vocabulary in the cost model: the head's GEMMs do the padded rows' products (in the time) but the
// model's FLOPs stay those of V = 50257; before the padding (kBefore) there is none.
TEST(Roofline, PaddedVocabularyCostsTimeNotModelFlops) {
  bench::RooflineConfig c;  // GPT-2 124M
  for (bench::KernelSet set : {bench::KernelSet::kBefore, bench::KernelSet::kNow}) {
    c.kernels = set;
    for (const bench::KernelCost& k : bench::step_kernels(c))
      if (k.name == "lm head fwd") {
        EXPECT_EQ(k.flops, 2.0 * 16 * 1024 * 768 * 50257);
        EXPECT_EQ(k.padding_flops, set == bench::KernelSet::kNow ? 2.0 * 16 * 1024 * 768 * (50304 - 50257) : 0.0);
      }
  }
}

}  // namespace
}  // namespace minidl
