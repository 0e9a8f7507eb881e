// The GPT MLP's GELU in the GEMM epilogue (ops/linear_gelu.h, autograd gelu_mlp): on the emulated device the fused
// path (one GEMM per direction, the emulator's model of cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD) against the
// unfused composition it replaces — the forced fallback on the same device (f32: the same bits), and the CPU ops —
// for ragged shapes, with and without bias, in f32, bf16 and f16; and the autograd node against linear ->
// bias_gelu -> linear, under autocast too. Likewise linear's bias gradient in its weight-gradient GEMM (BGRADA).
#include <functional>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/cuda/cuda.h"
#include "ops/gelu.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

// Forces the unfused fallback for its scope.
struct NoEpilogues {
  NoEpilogues() { ops::set_gemm_epilogues_enabled(false); }
  ~NoEpilogues() { ops::set_gemm_epilogues_enabled(true); }
};

Values host(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

struct Case {
  Shape x;    // (..., k)
  int64_t n;  // c_fc's output features
  bool bias;
};
// Rows not a multiple of the 32-row groups of the bias-gradient sum, n not a multiple of 8 (cuBLASLt's aux rule),
// k odd.
const Case kCases[] = {{{3, 5, 20}, 24, true}, {{2, 37, 13}, 36, true}, {{70, 16}, 40, false}};

std::string case_name(const Case& c, DType dt) {
  return shape_name(c.x) + " n " + std::to_string(c.n) + (c.bias ? " bias " : " no bias ") + dtype_name(dt);
}

TEST_F(CudaTensorOps, LinearGeluFusedMatchesTheFallbackAndTheCpu) {
  for (const Case& c : kCases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const std::string name = case_name(c, dt);
      const int64_t k = c.x[c.x.size() - 1];
      Shape out_shape = c.x;
      out_shape[out_shape.size() - 1] = c.n;
      const Tensor x = random_tensor(c.x, 1, dt), w = random_tensor({k, c.n}, 2, dt, 0.3);
      const Tensor b = c.bias ? random_tensor({c.n}, 3, dt) : Tensor();
      const Tensor dy = random_tensor(c.x, 4, dt), w_proj = random_tensor({c.n, k}, 5, dt, 0.3);
      const Tensor dx = x.to(kCuda), dw = w.to(kCuda), db = c.bias ? b.to(kCuda) : Tensor();
      const Tensor ddy = dy.to(kCuda), dw_proj = w_proj.to(kCuda);

      ops::LinearGelu fused, fallback;
      ops::DgeluBgrad grad, grad_fallback;
      const cuda::Counters forward = counted([&] { fused = ops::linear_gelu_forward(dx, dw, db); });
      EXPECT_EQ(forward.kernel_launches, 1) << "one GEMM with the GELU in its epilogue: " << name;
      const cuda::Counters backward = counted([&] { grad = ops::dgelu_bgrad(ddy, dw_proj, fused.aux, c.bias); });
      EXPECT_EQ(backward.kernel_launches, 1) << "one GEMM with dgelu and bgrad in its epilogue: " << name;
      EXPECT_EQ(forward.host_syncs + backward.host_syncs + forward.h2d_copies + backward.h2d_copies, 0) << name;
      {
        NoEpilogues off;
        fallback = ops::linear_gelu_forward(dx, dw, db);
        grad_fallback = ops::dgelu_bgrad(ddy, dw_proj, fallback.aux, c.bias);
      }
      ASSERT_EQ(fused.h.shape(), out_shape) << name;
      ASSERT_EQ(grad.dpre.shape(), out_shape) << name;
      EXPECT_EQ(grad.dbias.defined(), c.bias) << name;
      // The CPU composition: the reference of both device paths.
      const Tensor aux_cpu = ops::linear(x, w, b), h_cpu = ops::gelu_forward(aux_cpu);
      const Tensor dpre_cpu = ops::gelu_backward(ops::matmul(dy, w_proj, false, true), aux_cpu);
      const double tol = rtol_for(dt);
      for (const auto& [what, got] : {std::pair{"fused", &fused}, std::pair{"fallback", &fallback}}) {
        expect_device_matches(got->h, h_cpu, tol, std::string(what) + " h " + name);
        expect_device_matches(got->aux, aux_cpu, tol, std::string(what) + " aux " + name);
      }
      // The backward from the CPU's own aux, so that each side's error is one rounding, not two.
      expect_device_matches(grad.dpre, dpre_cpu, dt == DType::f32 ? 1e-5 : 2 * tol, "fused dpre " + name);
      expect_device_matches(grad_fallback.dpre, dpre_cpu, dt == DType::f32 ? 1e-5 : 2 * tol, "fallback dpre " + name);
      if (c.bias) {
        const Tensor dbias_cpu = ops::sum(ops::upcast(dpre_cpu).reshape({dpre_cpu.numel() / c.n, c.n}), 0);
        expect_close(host(grad.dbias), dbias_cpu.to_vector(), 2 * tol, "fused dbias " + name);
      }
      if (dt == DType::f32) {  // the same arithmetic in the same order: the same bits
        EXPECT_EQ(host(fused.h), host(fallback.h)) << name;
        EXPECT_EQ(host(fused.aux), host(fallback.aux)) << name;
        EXPECT_EQ(host(grad.dpre), host(grad_fallback.dpre)) << name;
        if (c.bias) { EXPECT_EQ(host(grad.dbias), host(grad_fallback.dbias)) << name; }
      }
    }
}

TEST_F(CudaTensorOps, LinearGeluChecksItsArguments) {
  const Tensor x = random_tensor({4, 6}, 1, DType::f32).to(kCuda), w = random_tensor({5, 8}, 2, DType::f32).to(kCuda);
  expect_error([&] { ops::linear_gelu_forward(x, w, Tensor()); },
               {"linear_gelu: expected w of shape (6, 8), got (5, 8)"});
  const Tensor aux = random_tensor({4, 8}, 3, DType::f32).to(kCuda);
  expect_error([&] { ops::dgelu_bgrad(x, w, aux, true); }, {"dgelu_bgrad: expected w of shape (8, 6), got (5, 8)"});
}

// The gradients of gelu_mlp and of the composition linear -> bias_gelu (or gelu) -> linear it replaces, for the
// same device inputs and output gradient.
struct MlpRun {
  std::vector<Values> values;  // y, dx, dW_fc, db_fc, dW_proj, db_proj
};

MlpRun run_mlp(bool fused, const Tensor& x, const Tensor& fc_w, const Tensor& fc_b, const Tensor& proj_w,
               const Tensor& proj_b, const Tensor& dy, DType amp) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : {x, fc_w, fc_b, proj_w, proj_b})
    leaves.push_back(t.defined() ? t.detach().clone().set_requires_grad(true) : Tensor());
  Tensor y;
  {
    autograd::AutocastGuard autocast(amp);
    if (fused) {
      y = gelu_mlp(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4]);
    } else {
      Tensor pre = matmul(leaves[0], leaves[1]);
      Tensor h = leaves[2].defined() ? bias_gelu(pre, leaves[2]) : gelu(pre);
      y = linear(h, leaves[3], leaves[4]);
    }
  }
  autograd::backward({y}, {dy.to(y.dtype())});
  MlpRun run{{host(y)}};
  for (const Tensor& t : leaves) run.values.push_back(t.defined() ? host(t.grad()) : Values{});
  return run;
}

TEST_F(CudaTensorOps, GeluMlpGradientsMatchTheUnfusedComposition) {
  const char* names[] = {"y", "dx", "dW_fc", "db_fc", "dW_proj", "db_proj"};
  for (bool bias : {true, false})
    for (DType amp : {DType::f32, DType::bf16}) {
      const std::string name = std::string(bias ? "bias " : "no bias ") + dtype_name(amp);
      const int64_t C = 12, H = 48;
      const Tensor x = random_tensor({2, 9, C}, 11, DType::f32).to(kCuda);
      const Tensor fc_w = random_tensor({C, H}, 12, DType::f32, 0.3).to(kCuda);
      const Tensor proj_w = random_tensor({H, C}, 13, DType::f32, 0.3).to(kCuda);
      const Tensor fc_b = bias ? random_tensor({H}, 14, DType::f32).to(kCuda) : Tensor();
      const Tensor proj_b = bias ? random_tensor({C}, 15, DType::f32).to(kCuda) : Tensor();
      const Tensor dy = random_tensor({2, 9, C}, 16, DType::f32).to(kCuda);
      MlpRun want, fused;
      const int64_t unfused_launches =
          counted([&] { want = run_mlp(false, x, fc_w, fc_b, proj_w, proj_b, dy, amp); }).kernel_launches;
      const int64_t fused_launches =
          counted([&] { fused = run_mlp(true, x, fc_w, fc_b, proj_w, proj_b, dy, amp); }).kernel_launches;
      // Forward: no bias + GELU kernel; backward: no GELU-backward kernel, nor (with bias) its partial sums.
      EXPECT_EQ(unfused_launches - fused_launches, bias ? 3 : 2) << name;
      MlpRun fallback;
      {
        NoEpilogues off;
        fallback = run_mlp(true, x, fc_w, fc_b, proj_w, proj_b, dy, amp);
      }
      for (size_t i = 0; i < want.values.size(); ++i) {
        // Under bf16 the fused GEMM rounds once where the composition rounds the product and then the GELU.
        const double tol = amp == DType::f32 ? 1e-5 : 2e-2;
        expect_close(fused.values[i], want.values[i], tol, std::string("fused ") + names[i] + " " + name);
        expect_close(fallback.values[i], want.values[i], tol, std::string("fallback ") + names[i] + " " + name);
        if (amp == DType::f32) {  // the emulator's epilogue computes what the unfused kernels do, in their order
          EXPECT_EQ(fused.values[i], want.values[i]) << "fused " << names[i] << " " << name;
          EXPECT_EQ(fallback.values[i], want.values[i]) << "fallback " << names[i] << " " << name;
        }
      }
    }
}

// linear's weight and bias gradients in one GEMM (the emulator's model of cuBLASLt's BGRADA) against the unfused
// product and column sum it replaces (the forced fallback: the same bits, since the emulated epilogue sums in the
// reduction kernel's order, in every dtype) and the CPU ops. Ragged rows and columns; several row chunks of the
// kernel's sum (200 rows); one column (its warp-shuffle order); 16-bit operands with 16-bit or f32 gradients.
TEST_F(CudaTensorOps, LinearWeightBiasGradFusedMatchesTheFallbackAndTheCpu) {
  struct Shape3 {
    int64_t rows, k, n;
  };
  for (const Shape3 c : {Shape3{37, 13, 24}, Shape3{200, 20, 40}, Shape3{70, 16, 1}, Shape3{5, 3, 33}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (bool f32_out : {false, true}) {
        if (dt == DType::f32 && f32_out) continue;
        const std::string name = shape_name({c.rows, c.k, c.n}) + " " + dtype_name(dt) + (f32_out ? " f32 out" : "");
        const Tensor x = random_tensor({c.rows, c.k}, 31, dt), dy = random_tensor({c.rows, c.n}, 32, dt);
        const Tensor dx = x.to(kCuda), ddy = dy.to(kCuda);
        ops::LinearGrad fused, fallback;
        const cuda::Counters counters = counted([&] { fused = ops::linear_weight_bias_grad(dx, ddy, f32_out); });
        EXPECT_EQ(counters.kernel_launches, 1) << "one GEMM with the bias gradient in its epilogue: " << name;
        EXPECT_EQ(counters.host_syncs + counters.h2d_copies + counters.d2h_copies, 0) << name;
        {
          NoEpilogues off;
          fallback = ops::linear_weight_bias_grad(dx, ddy, f32_out);
        }
        const DType out = f32_out ? DType::f32 : dt;
        for (const ops::LinearGrad* g : {&fused, &fallback}) {
          ASSERT_EQ(g->dw.shape(), (Shape{c.k, c.n})) << name;
          ASSERT_EQ(g->dbias.shape(), (Shape{c.n})) << name;
          EXPECT_EQ(g->dw.dtype(), out) << name;
          EXPECT_EQ(g->dbias.dtype(), out) << name;
        }
        EXPECT_EQ(host(fused.dw), host(fallback.dw)) << name;
        EXPECT_EQ(host(fused.dbias), host(fallback.dbias)) << name;
        // The CPU: the product in f32 and the column sums of the exact f32 values (in another order).
        const Tensor dw_cpu = ops::matmul(ops::upcast(x), ops::upcast(dy), true, false);
        const Tensor db_cpu = ops::sum(ops::upcast(dy), 0);
        const double tol = f32_out ? 1e-5 : rtol_for(dt);
        expect_close(host(fused.dw), dw_cpu.to_vector(), tol, "dw " + name);
        expect_close(host(fused.dbias), db_cpu.to_vector(), tol, "dbias " + name);
        // And the CPU's own op (the same fallback composition there).
        const ops::LinearGrad cpu = ops::linear_weight_bias_grad(x, dy, f32_out);
        EXPECT_EQ(cpu.dbias.dtype(), out) << name;
        expect_close(host(fused.dbias), cpu.dbias.to_vector(), tol, "cpu dbias " + name);
      }
}

// Through autograd: linear's backward on the device with the bias gradient in the weight-gradient GEMM, against
// the forced fallback (the same bits) and the CPU; without a bias nothing changes. The fused path saves the column
// sum's launches: one for these 18 rows (one row chunk) in f32; under bf16 autocast also the f32 copy of dy the
// fallback sums (the f32 bias gradient comes from the GEMM). Before, autocast rounded the bias gradient to bf16 and
// cast it back up: two more launches, and a 16-bit rounding, than this fallback.
TEST_F(CudaTensorOps, LinearBackwardPutsTheBiasGradientInTheGemm) {
  for (bool bias : {true, false})
    for (DType amp : {DType::f32, DType::bf16}) {
      const std::string name = std::string(bias ? "bias " : "no bias ") + dtype_name(amp);
      const Tensor x = random_tensor({2, 9, 12}, 41, DType::f32), w = random_tensor({12, 20}, 42, DType::f32, 0.3);
      const Tensor b = bias ? random_tensor({20}, 43, DType::f32) : Tensor();
      const Tensor dy = random_tensor({2, 9, 20}, 44, DType::f32);
      auto run = [&](Device device, int64_t* launches) {
        std::vector<Tensor> leaves;
        for (const Tensor& t : {x, w, b})
          leaves.push_back(t.defined() ? t.to(device).detach().clone().set_requires_grad(true) : Tensor());
        Tensor y;
        {
          autograd::AutocastGuard autocast(amp);
          y = linear(leaves[0], leaves[1], leaves[2]);
        }
        const Tensor g = dy.to(device).to(y.dtype());
        const cuda::Counters c = counted([&] { autograd::backward({y}, {g}); });
        if (launches) *launches = c.kernel_launches;
        std::vector<Values> grads;
        for (const Tensor& t : leaves) grads.push_back(t.defined() ? host(t.grad()) : Values{});
        if (bias) { EXPECT_EQ(leaves[2].grad().dtype(), DType::f32) << name; }
        return grads;
      };
      int64_t fused_launches = 0, fallback_launches = 0;
      const std::vector<Values> fused = run(kCuda, &fused_launches);
      std::vector<Values> fallback;
      {
        NoEpilogues off;
        fallback = run(kCuda, &fallback_launches);
      }
      const std::vector<Values> cpu = run(Device::cpu(), nullptr);
      EXPECT_EQ(fallback_launches - fused_launches, bias ? (amp == DType::f32 ? 1 : 2) : 0) << name;
      const char* names[] = {"dx", "dW", "db"};
      for (size_t i = 0; i < fused.size(); ++i) {
        EXPECT_EQ(fused[i], fallback[i]) << names[i] << " " << name;
        expect_close(fused[i], cpu[i], amp == DType::f32 ? 1e-5 : 2e-2, std::string(names[i]) + " " + name);
      }
    }
}

// On the CPU gelu_mlp is the composition too (nn::MLP keeps its own path there), within f32 rounding.
TEST(GeluMlpCpu, MatchesTheComposition) {
  const Tensor x = random_tensor({3, 4, 8}, 21, DType::f32), fc_w = random_tensor({8, 32}, 22, DType::f32, 0.3);
  const Tensor fc_b = random_tensor({32}, 23, DType::f32), proj_w = random_tensor({32, 8}, 24, DType::f32, 0.3);
  const Tensor proj_b = random_tensor({8}, 25, DType::f32), dy = random_tensor({3, 4, 8}, 26, DType::f32);
  const MlpRun want = run_mlp(false, x, fc_w, fc_b, proj_w, proj_b, dy, DType::f32);
  const MlpRun got = run_mlp(true, x, fc_w, fc_b, proj_w, proj_b, dy, DType::f32);
  for (size_t i = 0; i < want.values.size(); ++i) expect_close(got.values[i], want.values[i], 1e-5, "cpu");
}

}  // namespace
}  // namespace minidl::testing
