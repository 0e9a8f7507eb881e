// The MLP's GEMM epilogues (ops/linear_gelu.h) against the CPU ops on whatever CUDA backend the binary links: the
// emulated one in test_cuda_tensor_ops, cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD in gpu.* (test_cuda_device_ops_gpu,
// skipped without a device), and linear's BGRADA. One counted launch each way says the fused path ran, not the
// fallback. The emulated backend models every epilogue, so there the fused path must run; on a GPU cuBLASLt may have
// no fused algorithm for a shape, and the unfused composition runs instead (correct by construction): the values
// are checked either way, and the test prints which path ran.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/cuda/cuda.h"
#include "nn_test_util.h"
#include "ops/cast.h"
#include "ops/cuda/tensor/register.h"
#include "ops/gelu.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace minidl::testing {
namespace {

class GemmEpilogues : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ops::cuda::register_kernels(); }
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

Values host(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

// `launches` kernel launches ran `what`: one is the fused epilogue.
void expect_fused(int64_t launches, const std::string& what) {
#if defined(MINIDL_TEST_GPU)
  std::printf("%s: %s\n", what.c_str(),
              launches == 1 ? "fused" : "no fused algorithm for this shape, the fallback ran");
#else
  EXPECT_EQ(launches, 1) << what << ": the emulated backend models this epilogue, so it must run fused";
#endif
}

TEST_F(GemmEpilogues, GeluAuxBiasAndDgeluBgradRunFusedAndMatchTheCpu) {
  const Device cuda_dev = Device::cuda(0);
  const int64_t rows = 48, k = 32, n = 128;  // GPT-shaped: n = 4k, a multiple of 8 as cuBLASLt's aux requires
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
    const std::string name = dtype_name(dt);
    const Tensor x = random_tensor({rows, k}, 1, dt), w = random_tensor({k, n}, 2, dt, 0.3);
    const Tensor b = random_tensor({n}, 3, dt), dy = random_tensor({rows, k}, 4, dt);
    const Tensor w_proj = random_tensor({n, k}, 5, dt, 0.3);
    const Tensor aux_cpu = ops::linear(x, w, b), h_cpu = ops::gelu_forward(aux_cpu);
    const Tensor dpre_cpu = ops::gelu_backward(ops::matmul(dy, w_proj, false, true), aux_cpu);
    const Tensor dbias_cpu = ops::sum(ops::upcast(dpre_cpu), 0);

    const cuda::Counters before = cuda::counters();
    const ops::LinearGelu f = ops::linear_gelu_forward(x.to(cuda_dev), w.to(cuda_dev), b.to(cuda_dev));
    expect_fused((cuda::counters() - before).kernel_launches, "GELU_AUX_BIAS " + name);
    const Tensor dy_dev = dy.to(cuda_dev), w_proj_dev = w_proj.to(cuda_dev), aux_dev = aux_cpu.to(cuda_dev);
    const cuda::Counters mid = cuda::counters();
    const ops::DgeluBgrad g = ops::dgelu_bgrad(dy_dev, w_proj_dev, aux_dev, true);
    expect_fused((cuda::counters() - mid).kernel_launches, "DGELU_BGRAD " + name);

    expect_close(host(f.h), h_cpu.to_vector(), tol, "h " + name);
    expect_close(host(f.aux), aux_cpu.to_vector(), tol, "aux " + name);
    expect_close(host(g.dpre), dpre_cpu.to_vector(), tol, "dpre " + name);
    expect_close(host(g.dbias), dbias_cpu.to_vector(), tol, "dbias " + name);
  }
}

// linear's weight and bias gradients in one GEMM (BGRADA in gpu.*), against the CPU. Same-dtype outputs must run
// fused (one launch); bf16 inputs with f32 outputs (mixed precision) are checked for values, and whether cuBLASLt
// fused them is printed (the fallback is correct too: docs/decisions.md, "Linear's bias on a GPU").
TEST_F(GemmEpilogues, BgradaRunsFusedAndMatchesTheCpu) {
  const Device cuda_dev = Device::cuda(0);
  const int64_t rows = 96, k = 32, n = 64;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool f32_out : {false, true}) {
      if (dt == DType::f32 && f32_out) continue;
      const std::string name = std::string(dtype_name(dt)) + (f32_out ? " f32 out" : "");
      const double tol = dt == DType::f32 || f32_out ? 1e-4 : 2e-2;
      const Tensor x = random_tensor({rows, k}, 6, dt), dy = random_tensor({rows, n}, 7, dt);
      const Tensor dw_cpu = ops::matmul(ops::upcast(x), ops::upcast(dy), true, false);
      const Tensor db_cpu = ops::sum(ops::upcast(dy), 0);
      const Tensor x_dev = x.to(cuda_dev), dy_dev = dy.to(cuda_dev);
      const cuda::Counters before = cuda::counters();
      const ops::LinearGrad g = ops::linear_weight_bias_grad(x_dev, dy_dev, f32_out);
      const int64_t launches = (cuda::counters() - before).kernel_launches;
      if (f32_out) {
        std::printf("BGRADA with %s inputs and f32 outputs: %s\n", dtype_name(dt),
                    launches == 1 ? "fused" : "no algorithm, the fallback ran");
      } else {
        expect_fused(launches, "BGRADA " + name);
      }
      EXPECT_EQ(g.dw.dtype(), f32_out ? DType::f32 : dt) << name;
      expect_close(host(g.dw), dw_cpu.to_vector(), tol, "dw " + name);
      expect_close(host(g.dbias), db_cpu.to_vector(), tol, "dbias " + name);
    }
}

}  // namespace
}  // namespace minidl::testing
