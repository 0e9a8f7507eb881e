// The multi-tensor AdamW kernel (ops/cuda/adamw.cu), run on the emulator, against ops::fused_adamw_ over
// several steps: tensors of ragged sizes, one spanning several 64 Ki chunks, an unaligned one, and more tensors
// than one launch's list holds. The CPU op and the kernel share their per-element update (ops/kernels/adamw.h),
// so both are also checked against the textbook AdamW written out here in double, which shares nothing with them.
#include <cmath>
#include <vector>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/adamw.h"
#include "ops/cuda/adamw.h"

namespace minidl::testing {
namespace {

// Same math, but the CPU build may contract a*b+c into FMAs where the emulated build does not.
constexpr double kRtol = 1e-6;
// The f32 update against the double one: a few roundings of relative size 2^-24 per step, over 4 steps, where
// m / (sqrt(v) + eps) is near +-1 and p changes by lr per step (a wrong bias correction moves p by ~lr).
constexpr double kTextbookRtol = 1e-5;

// Decoupled weight decay, then the moments, then the bias-corrected step (Loshchilov and Hutter), in double.
struct TextbookAdamW {
  double lr, beta1, beta2, eps, weight_decay;
  void step(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m, std::vector<double>& v,
            int t) const {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(beta1, t)), v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// One parameter on both sides: CPU tensors for the reference op, device buffers (at `offset` floats into their
// allocation, to control alignment) for the kernel.
struct Param {
  Param(int64_t n, uint64_t seed, int64_t offset)
      : p(random_tensor({n}, seed, DType::f32)),
        m(Tensor::zeros({n})),
        v(Tensor::zeros({n})),
        dp(std::vector<float>(size_t(n + offset))),
        dg(size_t(n + offset)),
        dm(std::vector<float>(size_t(n + offset))),
        dv(std::vector<float>(size_t(n + offset))),
        offset(offset),
        ref_p(p.to_vector()),
        ref_m(size_t(n), 0.0),
        ref_v(size_t(n), 0.0) {
    std::vector<float> host(size_t(offset), 0.0f), values = floats(p);
    host.insert(host.end(), values.begin(), values.end());
    EXPECT_EQ(cudaMemcpy(dp.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ops::cuda::AdamWTensor device() const {
    return {dp.get() + offset, dg.get() + offset, dm.get() + offset, dv.get() + offset, p.numel()};
  }
  std::vector<double> device_values(const DeviceBuffer<float>& b) const {
    const std::vector<float> all = b.host();
    return std::vector<double>(all.begin() + offset, all.end());
  }

  Tensor p, m, v;
  DeviceBuffer<float> dp, dg, dm, dv;
  int64_t offset;
  std::vector<double> ref_p, ref_m, ref_v;  // TextbookAdamW's
};

void run_steps(std::vector<std::unique_ptr<Param>>& params, int steps) {
  const ops::AdamWHyper h{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  const TextbookAdamW textbook{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  for (int step = 1; step <= steps; ++step) {
    std::vector<ops::cuda::AdamWTensor> list;
    for (size_t i = 0; i < params.size(); ++i) {
      Param& q = *params[i];
      const Tensor g = random_tensor({q.p.numel()}, 1000 * uint64_t(step) + i, DType::f32);
      std::vector<float> host(size_t(q.offset), 0.0f), values = floats(g);
      host.insert(host.end(), values.begin(), values.end());
      ASSERT_EQ(cudaMemcpy(q.dg.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ops::AdamWHyper hs = h;
      hs.step = step;
      ops::fused_adamw_(q.p, g, q.m, q.v, hs);
      textbook.step(q.ref_p, g.to_vector(), q.ref_m, q.ref_v, step);
      list.push_back(q.device());
    }
    const auto constants = minidl::kernels::adamw_constants(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step);
    ASSERT_EQ(ops::cuda::fused_adamw(list.data(), int(list.size()), constants, nullptr), cudaSuccess);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& q = *params[i];
    const std::string what = "tensor " + std::to_string(i) + " ";
    expect_close(q.device_values(q.dp), q.p.to_vector(), kRtol, what + "param");
    expect_close(q.device_values(q.dm), q.m.to_vector(), kRtol, what + "m");
    expect_close(q.device_values(q.dv), q.v.to_vector(), kRtol, what + "v");
    expect_close(q.device_values(q.dp), q.ref_p, kTextbookRtol, what + "param against the textbook");
    expect_close(q.device_values(q.dm), q.ref_m, kTextbookRtol, what + "m against the textbook");
    expect_close(q.device_values(q.dv), q.ref_v, kTextbookRtol, what + "v against the textbook");
  }
}

TEST(CudaAdamW, RaggedTensorsOverSeveralStepsMatchTheCpuOp) {
  std::vector<std::unique_ptr<Param>> params;
  const int64_t sizes[] = {1, 3, 100, 2 * 65536 + 5, 1000, 0, 4};
  for (size_t i = 0; i < std::size(sizes); ++i) params.push_back(std::make_unique<Param>(sizes[i], i + 1, 0));
  params.push_back(std::make_unique<Param>(1001, 99, 1));  // not 16-byte aligned: the scalar path
  run_steps(params, 4);
}

TEST(CudaAdamW, MoreTensorsThanOneLaunchHolds) {
  std::vector<std::unique_ptr<Param>> params;
  for (int i = 0; i < 45; ++i) params.push_back(std::make_unique<Param>(5 + 7 * i, uint64_t(i) + 7, i % 3));
  run_steps(params, 3);
}

}  // namespace
}  // namespace minidl::testing
