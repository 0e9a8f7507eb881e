// GPT activation checkpointing (--recompute): every granularity gives gradients bitwise equal to no
// recomputation with dropout on (in f32 and under bf16 autocast), every parameter's gradient-ready hook fires once
// per backward, and the activation peak of the memory ledger goes down.
//
// The same source builds test_gpt_device (tests/nn/CMakeLists.txt) with MINIDL_TEST_EMULATED_CUDA: the model and
// batches then live on the emulated CUDA device, so recomputation is bitwise on the CUDA kernels too, and the
// device's losses and gradients are compared with the CPU's. test_gpt_gpu (MINIDL_TEST_GPU) does the same on a
// real GPU and skips without one (tests/gpu); its bitwise comparisons rely on cuBLAS's pinned workspace
// (ops/cuda/tensor/gemm_cublas.cpp), which keeps a product's algorithm the same in every pass.
#include <gtest/gtest.h>

#include "tests/support/test_device.h"

#if defined(MINIDL_TEST_CUDA)
#define GPT_RECOMPUTE_SUITE GPTRecomputeCuda
#else
#define GPT_RECOMPUTE_SUITE GPTRecompute
#endif

#include "autograd/autocast.h"
#include "core/rng.h"
#include "core/trace.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

using namespace minidl;
using minidl::testing::test_device;
using nn::Recompute;

namespace {

nn::GPTConfig small_config() {
  return {/*vocab*/ 23, /*block*/ 16, /*layers*/ 3, /*heads*/ 2, /*embd*/ 32, /*dropout*/ 0.2, /*bias*/ true};
}

Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int32_t> v(size_t(B * T));
  Philox rng(seed, 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(rng.draw(i).x % 23u);
  return Tensor::from_vector(v, Shape{B, T});
}

struct StepRun {
  double loss;
  std::vector<std::vector<double>> grads;
  int64_t act_peak;
};

StepRun run(Recompute mode, DType amp, Device device = test_device()) {
  nn::GPT model(small_config(), 5);
  model.to(device);
  model.train();
  model.set_recompute(mode);
  model.dropout_context().step = 3;
  Tensor x = tokens(4, 16, 1).to(device), y = tokens(4, 16, 2).to(device);
  MemoryLedger& mem = ledger(device);  // the device's own ledger: activations live there
  mem.reset_peaks();
  const int64_t act_before = mem.current(MemTag::kActivations);
  StepRun r;
  {
    MemoryTagGuard tag(MemTag::kActivations);
    std::optional<autograd::AutocastGuard> guard;
    if (amp != DType::f32) guard.emplace(amp);
    Tensor loss = model.loss(x, y);
    r.loss = loss.item();
    // Advancing the context between forward and backward must not change the recomputed masks.
    model.dropout_context().step += 1;
    loss.backward();
  }
  r.act_peak = mem.peak(MemTag::kActivations) - act_before;
  for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().to_vector());
  return r;
}

}  // namespace

TEST(GPT_RECOMPUTE_SUITE, GradientsBitwiseEqualToNoRecompute) {
  SKIP_WITHOUT_DEVICE();
  for (DType amp : {DType::f32, DType::bf16}) {
    StepRun plain = run(Recompute::kNone, amp);
    for (Recompute mode : {Recompute::kAttn, Recompute::kMlp, Recompute::kBlock}) {
      SCOPED_TRACE(std::string(nn::recompute_name(mode)) + " " + dtype_name(amp));
      StepRun r = run(mode, amp);
      EXPECT_EQ(r.loss, plain.loss);
      ASSERT_EQ(r.grads.size(), plain.grads.size());
      for (size_t i = 0; i < r.grads.size(); ++i) ASSERT_EQ(r.grads[i], plain.grads[i]) << "parameter " << i;
    }
  }
}

// Tracing records each block's backward as a span through identity nodes on the block's input and output
// (nn/block_hooks.cpp), so a traced backward runs a different graph: its loss and gradients are bitwise those of an
// untraced one, at every recompute setting.
TEST(GPT_RECOMPUTE_SUITE, TracingLeavesGradientsBitwiseEqual) {
  SKIP_WITHOUT_DEVICE();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("minidl_trace_gpt_" + std::to_string(::getpid()) + ".json")).string();
  for (Recompute mode : {Recompute::kNone, Recompute::kBlock}) {
    SCOPED_TRACE(nn::recompute_name(mode));
    StepRun plain = run(mode, DType::f32);
    trace::start(path, 0);
    StepRun traced = run(mode, DType::f32);
    ASSERT_EQ(trace::finish(), path);
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("block 2 backward"), std::string::npos) << "the traced run recorded no block backward";
    EXPECT_EQ(traced.loss, plain.loss);
    ASSERT_EQ(traced.grads.size(), plain.grads.size());
    for (size_t i = 0; i < traced.grads.size(); ++i) ASSERT_EQ(traced.grads[i], plain.grads[i]) << "parameter " << i;
  }
  std::filesystem::remove(path);
}

#if defined(MINIDL_TEST_CUDA)
// A whole training step on the device (forward, backward with recomputation and dropout, clipping's norm, AdamW,
// zero_grad) reaches a steady state: after the first steps have shown the allocator every size, later steps make
// no cudaMalloc or cudaFree.
TEST(GPT_RECOMPUTE_SUITE, SteadyStateTrainingStepMakesNoCudaMalloc) {
  SKIP_WITHOUT_DEVICE();
  nn::GPT model(small_config(), 5);
  model.to(test_device());
  model.train();
  model.set_recompute(Recompute::kMlp);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  std::vector<Tensor> params = model.parameters();
  auto step = [&](int64_t s) {
    model.dropout_context().step = s;
    MemoryTagGuard tag(MemTag::kActivations);
    Tensor loss = model.loss(tokens(4, 16, 2 * s).to(test_device()), tokens(4, 16, 2 * s + 1).to(test_device()));
    loss.backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
    return loss.item();
  };
  for (int64_t s = 0; s < 3; ++s) step(s);
  const cuda::AllocatorStats before = cuda::allocator_stats(0);
  for (int64_t s = 3; s < 6; ++s) EXPECT_TRUE(std::isfinite(step(s)));
  const cuda::AllocatorStats after = cuda::allocator_stats(0);
  EXPECT_EQ(after.cuda_mallocs, before.cuda_mallocs);
  EXPECT_EQ(after.cuda_frees, before.cuda_frees);
  EXPECT_GT(ledger(test_device()).peak(MemTag::kActivations), 0) << "the device ledger sees the step";
}
#endif

TEST(GPT_RECOMPUTE_SUITE, LossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  if (test_device().is_cpu()) GTEST_SKIP() << "the CPU is the reference";
  for (DType amp : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(amp));
    StepRun cpu = run(Recompute::kNone, amp, Device::cpu()), dev = run(Recompute::kNone, amp);
    const double tol = amp == DType::f32 ? 1e-5 : 2e-2;  // bf16: products rounded in another order
    EXPECT_NEAR(dev.loss, cpu.loss, tol * std::abs(cpu.loss));
    ASSERT_EQ(dev.grads.size(), cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      double scale = 1e-12;
      for (double g : cpu.grads[i]) scale = std::max(scale, std::abs(g));
      for (size_t j = 0; j < cpu.grads[i].size(); ++j)
        ASSERT_NEAR(dev.grads[i][j], cpu.grads[i][j], 50 * tol * scale) << "parameter " << i << " element " << j;
    }
  }
}

TEST(GPT_RECOMPUTE_SUITE, ActivationPeakDrops) {
  SKIP_WITHOUT_DEVICE();
  StepRun plain = run(Recompute::kNone, DType::f32), block = run(Recompute::kBlock, DType::f32);
  EXPECT_LT(block.act_peak, plain.act_peak);
}

TEST(GPT_RECOMPUTE_SUITE, HooksFireOncePerParameterPerBackward) {
  SKIP_WITHOUT_DEVICE();
  nn::GPT model(small_config(), 5);
  model.to(test_device());
  model.train();
  model.set_recompute(Recompute::kBlock);
  std::vector<Tensor> params = model.parameters();
  std::vector<int> fired(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) params[i].register_grad_ready_hook([&fired, i](Tensor&) { ++fired[i]; });
  model.loss(tokens(2, 16, 1).to(test_device()), tokens(2, 16, 2).to(test_device())).backward();
  for (size_t i = 0; i < fired.size(); ++i) EXPECT_EQ(fired[i], 1) << model.named_parameters()[i].first;
}

TEST(GPT_RECOMPUTE_SUITE, ParsesNames) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(nn::parse_recompute("block"), Recompute::kBlock);
  EXPECT_EQ(nn::parse_recompute("attn"), Recompute::kAttn);
  EXPECT_THROW(nn::parse_recompute("all"), Error);
}
