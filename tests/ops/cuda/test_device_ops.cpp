// The ops' CUDA entries on Tensors (ops/cuda/tensor/: matmul and linear through the backend GEMM, layernorm,
// attention, cross-entropy, embedding, dropout, casts, AdamW, unscale), run on the emulated CUDA backend and
// compared with the same op on the CPU: same inputs, results copied back. This exercises the whole device path
// (DeviceKernel dispatch, allocation through the caching allocator, launchers) rather than the kernels alone.
// test_cuda_device_ops_gpu is the same source against the real backend (cuBLAS, nvcc's kernels); it skips
// without a GPU.
#include <gtest/gtest.h>

#include "ops/cuda/tensor/register.h"
#include "nn_test_util.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cuda/tensor/gemm.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/embedding.h"
#include "ops/grad_norm.h"
#include "ops/layernorm.h"
#include "ops/matmul.h"
#include "ops/unscale.h"
#include "ops/vocab_range.h"

namespace minidl::testing {
namespace {

const Device kCuda = Device::cuda(0);

class DeviceOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ops::cuda::register_kernels(); }
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

Tensor on_cuda(const Tensor& t) { return t.to(kCuda); }
Values back(const Tensor& t) {
  EXPECT_EQ(t.device(), kCuda);
  return t.to(Device::cpu()).to_vector();
}

// The GEMM library loads and has every function the backend calls; needs no device (cuBLAS is opened with
// dlopen in the real backend, so a missing or renamed symbol would otherwise show only on a GPU).
TEST(GemmLibrary, LoadsWithEveryFunctionWithoutADevice) { EXPECT_NO_THROW(ops::cuda::load_gemm_library()); }

TEST_F(DeviceOps, MatmulAllTransposesAndBatchesMatchTheCpu) {
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const Case cases[] = {{{5, 7}, {7, 3}, false, false},       {{7, 5}, {7, 3}, true, false},
                        {{5, 7}, {3, 7}, false, true},        {{7, 5}, {3, 7}, true, true},
                        {{2, 3, 5, 7}, {7, 4}, false, false}, {{2, 5, 7}, {2, 7, 3}, false, false},
                        {{2, 7, 5}, {2, 3, 7}, true, true},   {{6, 9}, {2, 9, 4}, false, false},
                        {{0, 4}, {4, 3}, false, false},       {{3, 0}, {0, 2}, false, false}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Tensor a = random_tensor(c.a, seed++, DType::f32), b = random_tensor(c.b, seed++, DType::f32);
    Tensor want = ops::matmul(a, b, c.ta, c.tb);
    Tensor got = ops::matmul(on_cuda(a), on_cuda(b), c.ta, c.tb);
    EXPECT_EQ(got.shape(), want.shape());
    expect_close(back(got), want.to_vector(), 1e-5, "matmul");
  }
}

TEST_F(DeviceOps, HalfMatmulMatchesTheCpu) {
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor a = random_tensor({9, 17}, 3, dt), b = random_tensor({17, 5}, 4, dt);
    Tensor got = ops::matmul(on_cuda(a), on_cuda(b));
    EXPECT_EQ(got.dtype(), dt);
    expect_close(back(got), ops::matmul(a, b).to_vector(), dt == DType::f16 ? 2e-3 : 1e-2, "half matmul");
  }
}

TEST_F(DeviceOps, LinearWithAndWithoutBiasMatchesTheCpu) {
  Tensor x = random_tensor({2, 5, 7}, 5, DType::f32), w = random_tensor({7, 6}, 6, DType::f32);
  Tensor b = random_tensor({6}, 7, DType::f32);
  expect_close(back(ops::linear(on_cuda(x), on_cuda(w), on_cuda(b))), ops::linear(x, w, b).to_vector(), 1e-5,
               "linear+bias");
  expect_close(back(ops::linear(on_cuda(x), on_cuda(w), Tensor())), ops::linear(x, w, Tensor()).to_vector(), 1e-5,
               "linear");
}

TEST_F(DeviceOps, LayerNormForwardAndBackwardMatchTheCpu) {
  Tensor x = random_tensor({3, 11, 37}, 8, DType::f32, 2.0), dy = random_tensor({3, 11, 37}, 9, DType::f32);
  Tensor w = random_tensor({37}, 10, DType::f32), b = random_tensor({37}, 11, DType::f32);
  ops::LayerNormForward want = ops::layernorm_forward(x, w, b, 1e-5);
  ops::LayerNormForward got = ops::layernorm_forward(on_cuda(x), on_cuda(w), on_cuda(b), 1e-5);
  expect_close(back(got.y), want.y.to_vector(), 1e-5, "y");
  ops::LayerNormBackward gw = ops::layernorm_backward(dy, x, w, want.mean, want.rstd);
  ops::LayerNormBackward gg = ops::layernorm_backward(on_cuda(dy), on_cuda(x), on_cuda(w), got.mean, got.rstd);
  expect_close(back(gg.dx), gw.dx.to_vector(), 1e-5, "dx");
  expect_close(back(gg.dweight), gw.dweight.to_vector(), 1e-5, "dweight");
  expect_close(back(gg.dbias), gw.dbias.to_vector(), 1e-5, "dbias");
}

TEST_F(DeviceOps, CausalAttentionForwardAndBackwardMatchTheCpu) {
  const int64_t B = 2, T = 13, H = 2, C = 32;  // head dimension 16, a ragged T
  Tensor qkv = random_tensor({B, T, 3 * C}, 12, DType::f32), dout = random_tensor({B, T, C}, 13, DType::f32);
  ops::AttentionForward want = ops::causal_attention_forward(qkv, int(H));
  ops::AttentionForward got = ops::causal_attention_forward(on_cuda(qkv), int(H));
  expect_close(back(got.out), want.out.to_vector(), 1e-5, "out");
  expect_close(back(got.lse), want.lse.to_vector(), 1e-5, "lse");
  Tensor dwant = ops::causal_attention_backward(dout, qkv, want.out, want.lse, int(H));
  Tensor dgot = ops::causal_attention_backward(on_cuda(dout), on_cuda(qkv), got.out, got.lse, int(H));
  expect_close(back(dgot), dwant.to_vector(), 1e-4, "dqkv");
  expect_error(
      [&] {
        ops::causal_attention_forward(on_cuda(random_tensor({1, 4, 3 * 24}, 1, DType::f32)), 1);
      },
      {"causal_attention", "head dimension 16, 32 or 64", "24"});
}

// 16-bit qkv reaching the CUDA entry (ops::causal_attention_forward_device): head dimension 32 runs the
// tensor-core kernels, 16 the f32 kernel on an f32 copy; both against the CPU op in f32 on the same 16-bit values.
TEST_F(DeviceOps, HalfAttentionOnTheDeviceMatchesTheCpuInF32) {
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {16, 32}) {
      const int64_t B = 2, T = 21, H = 2, C = H * D;
      const double rtol = dt == DType::bf16 ? 1.5e-2 : 3e-3;
      const std::string what = std::string(dt == DType::bf16 ? "bf16" : "f16") + " D " + std::to_string(D) + " ";
      const Tensor qkv16 = random_tensor({B, T, 3 * C}, 31, dt), dout16 = random_tensor({B, T, C}, 32, dt);
      const Tensor qkv = ops::cast(qkv16, DType::f32), dout = ops::cast(dout16, DType::f32);
      ops::AttentionForward want = ops::causal_attention_forward(qkv, int(H));
      ops::AttentionForward got = ops::causal_attention_forward_device(kCuda)(on_cuda(qkv16), int(H), int(H));
      EXPECT_EQ(got.out.dtype(), dt);
      expect_close(back(got.out), want.out.to_vector(), rtol, what + "out");
      expect_close(back(got.lse), want.lse.to_vector(), 1e-4, what + "lse");
      Tensor dwant = ops::causal_attention_backward(dout, qkv, want.out, want.lse, int(H));
      Tensor dgot = ops::causal_attention_backward_device(kCuda)(on_cuda(dout16), on_cuda(qkv16), got.out, got.lse,
                                                                 int(H), int(H));
      EXPECT_EQ(dgot.dtype(), dt);
      expect_close(back(dgot), dwant.to_vector(), rtol, what + "dqkv");
    }
}

// Grouped kv heads through the ops entry: f32 on the f32 kernels, 16-bit with head dimension 32 on the tensor-core
// kernels and 16 on the f32 kernels through a copy; each against the CPU op in f32 on the same values.
TEST_F(DeviceOps, GroupedAttentionOnTheDeviceMatchesTheCpu) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t D : {16, 32}) {
      const int64_t B = 2, T = 21, H = 6, Hkv = 2, C = H * D;
      const double rtol = dt == DType::bf16 ? 1.5e-2 : dt == DType::f16 ? 3e-3 : 1e-5;
      const std::string what = std::string(dt == DType::f32    ? "f32"
                                           : dt == DType::bf16 ? "bf16"
                                                               : "f16") +
                               " D " + std::to_string(D) + " ";
      const Tensor qkv_dt = random_tensor({B, T, (H + 2 * Hkv) * D}, 33, dt),
                   dout_dt = random_tensor({B, T, C}, 34, dt);
      const Tensor qkv = ops::cast(qkv_dt, DType::f32), dout = ops::cast(dout_dt, DType::f32);
      ops::AttentionForward want = ops::causal_attention_forward(qkv, int(H), int(Hkv));
      ops::AttentionForward got = ops::causal_attention_forward(on_cuda(qkv_dt), int(H), int(Hkv));
      EXPECT_EQ(got.out.dtype(), dt);
      expect_close(back(got.out), want.out.to_vector(), rtol, what + "out");
      expect_close(back(got.lse), want.lse.to_vector(), dt == DType::f32 ? 1e-5 : 1e-4, what + "lse");
      Tensor dwant = ops::causal_attention_backward(dout, qkv, want.out, want.lse, int(H), int(Hkv));
      Tensor dgot =
          ops::causal_attention_backward(on_cuda(dout_dt), on_cuda(qkv_dt), got.out, got.lse, int(H), int(Hkv));
      EXPECT_EQ(dgot.dtype(), dt);
      EXPECT_EQ(dgot.shape(), qkv.shape());
      expect_close(back(dgot), dwant.to_vector(), dt == DType::f32 ? 1e-4 : rtol, what + "dqkv");
    }
  expect_error(
      [&] {
        ops::causal_attention_forward(on_cuda(random_tensor({1, 4, 5 * 16}, 1, DType::f32)), 3, 2);
      },
      {"causal_attention", "n_head = 3", "n_kv_head = 2"});
}

TEST_F(DeviceOps, CrossEntropyForwardAndBackwardMatchTheCpuAndCheckTargets) {
  const int64_t N = 37, V = 65;
  Tensor logits = random_tensor({N, V}, 14, DType::f32, 3.0);
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = i % 7 == 3 ? -1 : (i * 11) % V;
  Tensor targets = Tensor::from_vector(t, Shape{N});
  for (ops::Reduction r : {ops::Reduction::kMean, ops::Reduction::kSum}) {
    ops::CrossEntropyForward want = ops::cross_entropy_forward(logits, targets, -1, r);
    ops::CrossEntropyForward got = ops::cross_entropy_forward(on_cuda(logits), on_cuda(targets), -1, r);
    EXPECT_EQ(got.count, want.count);
    expect_close(back(got.loss), want.loss.to_vector(), 1e-5, "loss");
    expect_close(back(got.lse), want.lse.to_vector(), 1e-5, "lse");
    Tensor dloss = Tensor::full({}, 0.5);
    int64_t divisor = r == ops::Reduction::kMean ? want.count : 1;
    Tensor dwant = ops::cross_entropy_backward(dloss, logits, targets, want.lse, divisor, -1);
    Tensor dgot = ops::cross_entropy_backward(on_cuda(dloss), on_cuda(logits), on_cuda(targets), got.lse, divisor, -1);
    expect_close(back(dgot), dwant.to_vector(), 1e-5, "dlogits");
  }
  t[5] = V;
  expect_error([&] { ops::cross_entropy_forward(on_cuda(logits), on_cuda(Tensor::from_vector(t, Shape{N})), -1); },
               {"cross_entropy", "target 65 at row 5", "out of range"});
}

// The fused classifier over 16-bit logits: bf16/f16 read as they are (f32 math, f32 lse and loss), a padded row
// stride (65 classes in rows of 128: vectorised, with a scalar tail; 37 in rows of 37: scalar), ignored rows, and
// dlogits written over the logits. Reference: the CPU op on the same 16-bit values widened to f32 (exact), its
// dlogits rounded to the 16-bit type like the kernel's: equal within one 16-bit rounding.
TEST_F(DeviceOps, CrossEntropyOver16BitLogitsWithPaddedStrideMatchesTheCpu) {
  const int64_t N = 19;
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [V, Vp] : {std::pair<int64_t, int64_t>{65, 128}, {37, 37}})
      for (bool in_place : {false, true}) {
        const std::string what = std::string(dtype_name(dt)) + " V " + std::to_string(V) + " Vp " + std::to_string(Vp) +
                                 (in_place ? " in place: " : ": ");
        const Tensor logits16 = ops::cast(random_tensor({N, Vp}, 21, DType::f32, 3.0), dt);
        const Tensor logits = ops::upcast(logits16);
        std::vector<int64_t> t(N);
        for (int64_t i = 0; i < N; ++i) t[size_t(i)] = i % 5 == 2 ? -1 : (i * 13) % V;
        const Tensor targets = Tensor::from_vector(t, Shape{N});
        ops::CrossEntropyForward want = ops::cross_entropy_forward(logits, targets, -1, ops::Reduction::kMean, V);
        Tensor device_logits = on_cuda(logits16);
        ops::CrossEntropyForward got =
            ops::cross_entropy_forward(device_logits, on_cuda(targets), -1, ops::Reduction::kMean, V);
        EXPECT_EQ(got.loss.dtype(), DType::f32);
        EXPECT_EQ(got.lse.dtype(), DType::f32);
        expect_close(back(got.loss), want.loss.to_vector(), 1e-5, what + "loss");
        expect_close(back(got.lse), want.lse.to_vector(), 1e-5, what + "lse");
        Tensor dloss = Tensor::full({}, 0.5);
        Tensor dwant = ops::cast(ops::cross_entropy_backward(dloss, logits, targets, want.lse, want.count, -1, V), dt);
        Tensor dgot = ops::cross_entropy_backward(on_cuda(dloss), device_logits, on_cuda(targets), got.lse, got.count,
                                                  -1, V, in_place);
        EXPECT_EQ(dgot.dtype(), dt);
        EXPECT_EQ(dgot.raw_device_data() == device_logits.raw_device_data(), in_place) << what << "in place";
        // f32 exps on both sides, rounded once to 16 bits: at most one rounding step apart.
        expect_close(back(dgot), ops::upcast(dwant).to_vector(), dt == DType::bf16 ? 1e-2 : 2e-3, what + "dlogits");
        const std::vector<double> d = back(dgot);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = V; j < Vp; ++j) ASSERT_EQ(d[size_t(i * Vp + j)], 0.0) << what << "padded column " << j;
      }
}

TEST_F(DeviceOps, EmbeddingForwardAndBackwardMatchTheCpuAndCheckIds) {
  Tensor w = random_tensor({11, 19}, 15, DType::f32), g = random_tensor({3, 7, 19}, 16, DType::f32);
  std::vector<int32_t> v(21);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t((i * 5) % 11);
  Tensor ids = Tensor::from_vector(v, Shape{3, 7});
  expect_close(back(ops::embedding_forward(on_cuda(w), on_cuda(ids))), ops::embedding_forward(w, ids).to_vector(), 0,
               "embedding");
  expect_close(back(ops::embedding_backward(on_cuda(g), on_cuda(ids), 11)),
               ops::embedding_backward(g, ids, 11).to_vector(), 0, "embedding_backward (deterministic: same bits)");
  ops::set_deterministic_embedding_backward(false);  // float atomics: the same sums up to rounding
  expect_close(back(ops::embedding_backward(on_cuda(g), on_cuda(ids), 11)),
               ops::embedding_backward(g, ids, 11).to_vector(), 1e-6, "embedding_backward (atomics)");
  ops::set_deterministic_embedding_backward(true);
  v[4] = 11;
  expect_error(
      [&] {
        ops::embedding_forward(on_cuda(w), on_cuda(Tensor::from_vector(v, Shape{3, 7})));
      },
      {"embedding", "id 11 at position 4", "out of range"});
}

TEST_F(DeviceOps, DropoutDrawsTheCpuMaskBitForBit) {
  Tensor x = random_tensor({5, 33}, 17, DType::f32);
  expect_close(back(ops::dropout(on_cuda(x), 0.3, 42, 7, 100)), ops::dropout(x, 0.3, 42, 7, 100).to_vector(), 0,
               "dropout");
}

// The step read on the device (ops::DropoutStep, CUDA graphs) draws the mask of the plain call at the offset it
// adds, on the CPU and the device; the kernel reads the step's value when it runs (a refill changes the mask).
TEST_F(DeviceOps, DropoutStepOnTheDeviceIsTheOffsetItAdds) {
  Tensor x = random_tensor({5, 33}, 17, DType::f32);
  const uint64_t per_step = uint64_t(1) << 40;
  for (const int64_t s : {int64_t(0), int64_t(3), int64_t(5000001)}) {
    const Values want = ops::dropout(x, 0.3, 42, 7, 100 + uint64_t(s) * per_step).to_vector();
    Tensor step = Tensor::zeros({1}, DType::i64, kCuda);
    step.fill_(double(s));
    expect_close(back(ops::dropout(on_cuda(x), 0.3, 42, 7, 100, {step, per_step})), want, 0, "device step");
    Tensor host_step = Tensor::zeros({1}, DType::i64);
    host_step.fill_(double(s));
    expect_close(ops::dropout(x, 0.3, 42, 7, 100, {host_step, per_step}).to_vector(), want, 0, "host step");
  }
  EXPECT_NE(ops::dropout(x, 0.3, 42, 7, 100).to_vector(), ops::dropout(x, 0.3, 42, 7, 100 + per_step).to_vector());
}

// The gradient norm and the clip over more tensors than one chunk list holds (64): the later lists' partial sums land
// after the first's (ChunkList::first_chunk), so the norm is the CPU's bit for bit, and every tensor is clipped.
TEST_F(DeviceOps, GradNormAndClipOverSeveralChunkListsMatchTheCpu) {
  std::vector<Tensor> host, device;
  for (int i = 0; i < 70; ++i) {
    host.push_back(random_tensor({3 + 5 * i}, 30 + i, DType::f32));
    device.push_back(on_cuda(host.back()));
  }
  const Tensor sq_host = ops::grad_norm_squared_multi(host, Device::cpu());
  const Tensor sq_device = ops::grad_norm_squared_multi(device, kCuda);
  expect_close(back(sq_device), sq_host.to_vector(), 0, "norm squared");
  ops::clip_grads_multi_(host, sq_host, 0.5);
  ops::clip_grads_multi_(device, sq_device, 0.5);
  for (size_t i = 0; i < host.size(); ++i) expect_close(back(device[i]), host[i].to_vector(), 0, "clipped tensor");
}

TEST_F(DeviceOps, CastsMatchTheCpuBitForBit) {
  Tensor x = random_tensor({1031}, 18, DType::f32, 100.0);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor h = ops::cast(on_cuda(x), dt);
    EXPECT_EQ(h.dtype(), dt);
    expect_close(back(h), ops::cast(x, dt).to_vector(), 0, "to 16 bits");
    expect_close(back(ops::cast(h, DType::f32)), ops::cast(ops::cast(x, dt), DType::f32).to_vector(), 0, "to f32");
  }
  expect_close(back(ops::cast(on_cuda(x), DType::f64)), x.to_vector(), 0, "f64 through copy_");
}

TEST_F(DeviceOps, AdamWAndUnscaleMatchTheCpu) {
  const int64_t n = 1000;
  Tensor p = random_tensor({n}, 19, DType::f32), g = random_tensor({n}, 20, DType::f32);
  Tensor m = random_tensor({n}, 21, DType::f32, 0.1), v = Tensor::full({n}, 0.01);
  Tensor dp = on_cuda(p), dg = on_cuda(g), dm = on_cuda(m), dv = on_cuda(v);
  ops::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, 3};
  ops::fused_adamw_(p, g, m, v, h);
  ops::fused_adamw_(dp, dg, dm, dv, h);
  expect_close(back(dp), p.to_vector(), 1e-6, "param");
  expect_close(back(dm), m.to_vector(), 1e-6, "m");
  expect_close(back(dv), v.to_vector(), 1e-6, "v");

  // The multi-tensor forms: one launch for a list, against the single-tensor CPU op.
  std::vector<Tensor> ps, gs, ms, vs, dps, dgs, dms, dvs;
  for (int64_t k = 0; k < 3; ++k) {
    int64_t len = 100 + 37 * k;
    ps.push_back(random_tensor({len}, 30 + k, DType::f32));
    gs.push_back(random_tensor({len}, 40 + k, DType::f32));
    ms.push_back(Tensor::zeros({len}));
    vs.push_back(Tensor::zeros({len}));
    dps.push_back(on_cuda(ps.back()));
    dgs.push_back(on_cuda(gs.back()));
    dms.push_back(on_cuda(ms.back()));
    dvs.push_back(on_cuda(vs.back()));
  }
  ops::fused_adamw_multi_(dps, dgs, dms, dvs, h);
  for (size_t k = 0; k < ps.size(); ++k) {
    ops::fused_adamw_(ps[k], gs[k], ms[k], vs[k], h);
    expect_close(back(dps[k]), ps[k].to_vector(), 1e-6, "multi param");
    expect_close(back(dvs[k]), vs[k].to_vector(), 1e-6, "multi v");
  }
  EXPECT_FALSE(ops::unscale_and_check_multi_(dgs, 2.0f));
  gs[1].data<float>()[5] = NAN;
  EXPECT_TRUE(ops::unscale_and_check_multi_({dgs[0], on_cuda(gs[1]), dgs[2]}, 2.0f));

  EXPECT_FALSE(ops::unscale_and_check_(dg, 0.5f));
  EXPECT_FALSE(ops::unscale_and_check_(g, 0.5f));
  expect_close(back(dg), g.to_vector(), 0, "unscaled");
  Values with_inf = g.to_vector();
  with_inf[777] = INFINITY;
  EXPECT_TRUE(ops::unscale_and_check_(on_cuda(Tensor::from_vector(with_inf, Shape{n})), 1.0f));
}

TEST_F(DeviceOps, MixedDevicesAreRefusedByName) {
  Tensor a = random_tensor({2, 3}, 1, DType::f32), b = random_tensor({3, 2}, 2, DType::f32);
  expect_error([&] { ops::matmul(a, on_cuda(b)); }, {"matmul", "cpu", "cuda:0"});
  Tensor w = random_tensor({3}, 3, DType::f32);
  expect_error([&] { ops::layernorm_forward(on_cuda(a), w, w, 1e-5); }, {"layernorm", "weight", "cuda:0", "cpu"});
}

// Tensor parallelism's vocabulary ranges (dist/tensor_parallel.cpp) on the device equal the CPU loop, and the CPU
// loop equals the rule written out here: ids inside and outside the range, at both ends, ignored targets.
TEST_F(DeviceOps, VocabRangeMatchesTheCpuAndTheRule) {
  const std::vector<int64_t> ids = {0, 32, 33, 40, 65, -1, 64, 33, 7, -1, 50, 66};
  const int64_t start = 33, length = 33;
  for (const auto& [row_stride, ignore] : {std::pair<int64_t, int64_t>{0, -1}, {length, -1}, {length, 40}}) {
    Tensor host = Tensor::from_vector(ids, {3, 4});
    ops::VocabRange want = ops::vocab_range(host, start, length, row_stride, ignore);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool mine = ids[i] != ignore && ids[i] >= start && ids[i] < start + length;
      EXPECT_EQ(want.index.to_vector()[i], mine ? double(int64_t(i) * row_stride + ids[i] - start) : 0.0) << i;
      EXPECT_EQ(want.in_range.to_vector()[i], mine ? 1.0 : 0.0) << i;
      EXPECT_EQ(want.counted.to_vector()[i], ids[i] == ignore ? 0.0 : 1.0) << i;
    }
    ops::VocabRange got = ops::vocab_range(on_cuda(host), start, length, row_stride, ignore);
    EXPECT_EQ(got.index.dtype(), DType::i64);
    EXPECT_EQ(got.index.shape(), (Shape{3, 4}));
    EXPECT_EQ(back(got.index), want.index.to_vector());
    EXPECT_EQ(back(got.in_range), want.in_range.to_vector());
    EXPECT_EQ(back(got.counted), want.counted.to_vector());
  }
  EXPECT_THROW(ops::vocab_range(on_cuda(Tensor::from_vector(std::vector<int32_t>{1}, {1})), 0, 1, 0, -1), Error);
}

}  // namespace
}  // namespace minidl::testing
