// The multi-tensor AdamW kernel (ops/cuda/adamw.cu), run on the emulator, against ops::fused_adamw_ over
// several steps: tensors of ragged sizes, one spanning several 64 Ki chunks, an unaligned one, and more tensors
// than one launch's list holds.
#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/adamw.h"
#include "ops/cuda/adamw.h"

namespace minidl::testing {
namespace {

// Same math, but the CPU build may contract a*b+c into FMAs where the emulated build does not.
constexpr double kRtol = 1e-6;

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
        offset(offset) {
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
};

void run_steps(std::vector<std::unique_ptr<Param>>& params, int steps) {
  const ops::AdamWHyper h{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= steps; ++step) {
    std::vector<ops::cuda::AdamWTensor> list;
    for (size_t i = 0; i < params.size(); ++i) {
      Param& q = *params[i];
      const Tensor g = random_tensor({q.p.numel()}, 1000 * uint64_t(step) + i, DType::f32);
      std::vector<float> host(size_t(q.offset), 0.0f), values = floats(g);
      host.insert(host.end(), values.begin(), values.end());
      ASSERT_EQ(cudaMemcpy(q.dg.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
      ops::AdamWHyper hs = h;
      hs.step = step;
      ops::fused_adamw_(q.p, g, q.m, q.v, hs);
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
