// DDP with its parameters on a CUDA device: the buckets live on the device and are all-reduced by "nccl" or by the
// ring on the device. The loss is computed on the CPU from p.to(cpu), so the gradient reaches each parameter
// through to()'s backward, on the device, without any device op; it is a rank-dependent integer pattern, so the
// averaged gradient is known exactly.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "core/cuda/cuda.h"
#include "dist/cuda/backend.h"
#include "dist/ddp.h"
#include "dist_test_util.h"

namespace minidl::testing {
namespace {

const Device kDevice = Device::cuda(0);

// Three parameters of awkward sizes, initialised differently on every rank (DDP must broadcast rank 0's).
class DeviceParams : public nn::Module {
 public:
  explicit DeviceParams(int rank) {
    for (auto [name, numel] : {std::pair{"a", int64_t(15)}, {"b", int64_t(7)}, {"c", int64_t(1)}})
      params.push_back(
          register_parameter(name, Tensor::full({numel}, 10.0 + rank, DType::f32, kDevice).set_requires_grad(true)));
  }
  std::vector<Tensor> params;
};

class DeviceDDP : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cuda::register_backend();
    group_ = GetParam() == "nccl" ? dist::make_process_group("nccl", MPI_COMM_WORLD, kDevice)
                                  : std::make_unique<dist::RingProcessGroup>(MPI_COMM_WORLD, kDevice);
  }
  std::unique_ptr<dist::ProcessGroup> group_;
};

TEST_P(DeviceDDP, AveragesGradientsOnTheDevice) {
  const int rank = group_->rank(), n = group_->size();
  DeviceParams model(rank);
  // 8-byte buckets: the parameters spread over several buckets.
  dist::DistributedDataParallel ddp(model, *group_, {.caps = {.bucket_cap_bytes = 8, .first_bucket_cap_bytes = 8}});
  EXPECT_GE(ddp.buckets().size(), 2u);
  for (const Tensor& p : model.params) EXPECT_EQ(p.to_vector(), std::vector<double>(p.numel(), 10.0));

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    Tensor loss = Tensor::scalar(0.0);
    int64_t offset = 0;
    for (const Tensor& p : model.params) {
      loss = add(loss, sum(mul(p.to(Device::cpu()), pattern_tensor(rank, p.numel(), DType::f32, offset + step))));
      offset += p.numel();
    }
    loss.backward();
    offset = 0;
    for (Tensor& p : model.params) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().device(), kDevice);
      std::vector<double> got = p.grad().to_vector();
      int64_t wrong = 0;
      for (int64_t i = 0; i < p.numel(); ++i)
        wrong += got[i] != expected_reduction(dist::ReduceOp::kAvg, n, offset + step + i, DType::f32);
      EXPECT_EQ(wrong, 0);
      offset += p.numel();
      p.set_grad(Tensor());
    }
  }
}

TEST_P(DeviceDDP, RejectsParametersOnAnotherDevice) {
  nn::Module model;
  model.register_parameter("w", Tensor::zeros({3}).set_requires_grad(true));
  EXPECT_THROW(dist::DistributedDataParallel(model, *group_), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceDDP, ::testing::Values("nccl", "ring"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace minidl::testing
