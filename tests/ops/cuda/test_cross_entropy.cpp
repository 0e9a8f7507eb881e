// The fused softmax + cross-entropy kernels (ops/cuda/cross_entropy.cu), run on the emulator, against
// ops::cross_entropy_forward and cross_entropy_backward: row lengths below, around and above the block (1, 31,
// 65, 1000; 1000 also takes the vectorised path), a padded row stride (V = 65 or 1001 classes in rows of 128 or
// 1024: the vectorised path with a scalar tail, padded columns never read and given zero gradients), ignored rows,
// the mean and the sum, and an all-ignored batch.
#include <bit>
#include <cmath>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cross_entropy.h"
#include "ops/cuda/cross_entropy.h"

namespace minidl::testing {
namespace {

constexpr double kRtol = 1e-5;
constexpr int64_t kIgnore = -100;

struct CrossEntropyCase {
  int64_t rows;
  int64_t classes;
  bool mean;
  int64_t stride = 0;  // 0: classes (no padding)
};

// Targets spread over the classes, every third row ignored (all rows when `all_ignored`).
std::vector<int64_t> make_targets(int64_t rows, int64_t classes, bool all_ignored) {
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t[size_t(r)] = all_ignored || r % 3 == 1 ? kIgnore : (r * 7919) % classes;
  return t;
}

void check_against_cpu(int64_t rows, int64_t classes, bool mean, bool all_ignored, int64_t stride = 0) {
  if (stride == 0) stride = classes;
  // Padded columns hold huge values: any read of them in the forward would show in the lse.
  Tensor logits = random_tensor({rows, stride}, uint64_t(classes), DType::f32, 3.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = classes; j < stride; ++j) logits.data<float>()[r * stride + j] = 1e4f;
  const std::vector<int64_t> target_values = make_targets(rows, classes, all_ignored);
  const Tensor targets = Tensor::from_vector(target_values, {rows});
  const ops::Reduction reduction = mean ? ops::Reduction::kMean : ops::Reduction::kSum;
  const ops::CrossEntropyForward want = ops::cross_entropy_forward(logits, targets, kIgnore, reduction, classes);
  const float dloss_value = 0.75f;
  const Tensor want_grad = ops::cross_entropy_backward(Tensor::scalar(dloss_value), logits, targets, want.lse,
                                                       mean ? want.count : 1, kIgnore, classes);

  DeviceBuffer<float> dlogits_in(floats(logits)), lse(rows), row_loss(rows), loss(1), dlogits(rows * stride);
  DeviceBuffer<int64_t> dtargets(target_values), count(1);
  DeviceBuffer<float> dloss(std::vector<float>{dloss_value});
  ASSERT_EQ(ops::cuda::cross_entropy_forward(dlogits_in.get(), dtargets.get(), lse.get(), row_loss.get(), loss.get(),
                                             count.get(), rows, classes, stride, kIgnore, mean, nullptr),
            cudaSuccess);
  EXPECT_EQ(count.host()[0], want.count);
  expect_close(doubles(lse.host()), want.lse.to_vector(), kRtol, "lse");
  const float got_loss = loss.host()[0], want_loss = float(want.loss.item());
  if (std::isnan(want_loss)) {
    EXPECT_TRUE(std::isnan(got_loss));
  } else {
    EXPECT_NEAR(got_loss, want_loss, kRtol * std::abs(want_loss)) << "loss";
  }

  ASSERT_EQ(ops::cuda::cross_entropy_backward(dloss.get(), dlogits_in.get(), dtargets.get(), lse.get(),
                                              mean ? count.get() : nullptr, dlogits.get(), rows, classes, stride,
                                              kIgnore, nullptr),
            cudaSuccess);
  expect_close(doubles(dlogits.host()), want_grad.to_vector(), kRtol, "dlogits");

  // The loss is added in a fixed order: a second run gives the same bits.
  ASSERT_EQ(ops::cuda::cross_entropy_forward(dlogits_in.get(), dtargets.get(), lse.get(), row_loss.get(), loss.get(),
                                             count.get(), rows, classes, stride, kIgnore, mean, nullptr),
            cudaSuccess);
  EXPECT_EQ(std::bit_cast<uint32_t>(loss.host()[0]), std::bit_cast<uint32_t>(got_loss)) << "run to run";
}

class CudaCrossEntropy : public ::testing::TestWithParam<CrossEntropyCase> {};

TEST_P(CudaCrossEntropy, ForwardAndBackwardMatchTheCpuOp) {
  const auto [rows, classes, mean, stride] = GetParam();
  check_against_cpu(rows, classes, mean, false, stride);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCrossEntropy,
                         ::testing::Values(CrossEntropyCase{4, 1, true}, CrossEntropyCase{7, 31, true},
                                           CrossEntropyCase{9, 65, false}, CrossEntropyCase{5, 1000, true},
                                           CrossEntropyCase{300, 33, true}, CrossEntropyCase{3, 1000, false},
                                           CrossEntropyCase{6, 65, true, 128}, CrossEntropyCase{4, 1001, false, 1024}),
                         [](const auto& info) {
                           return "rows" + std::to_string(info.param.rows) + "_V" + std::to_string(info.param.classes) +
                                  (info.param.mean ? "_mean" : "_sum") +
                                  (info.param.stride ? "_stride" + std::to_string(info.param.stride) : "");
                         });

TEST(CudaCrossEntropyIgnored, AllRowsIgnoredGiveNanMeanAndZeroGradient) {
  check_against_cpu(4, 31, true, true);
  check_against_cpu(4, 31, false, true);
}

}  // namespace
}  // namespace minidl::testing
