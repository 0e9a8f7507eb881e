// The flash-style causal attention kernels (ops/cuda/attention.cu, attention_backward.cu), run on the emulator,
// against ops::causal_attention_forward and causal_attention_backward: sequence lengths around the 16-query
// block and the 32-key tile (1, 5, 64, 70, 130), head dimensions 16, 32 and 64, one and several heads and
// batches, grouped kv heads (GQA, MQA); the backward's bits run to run.
#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"

namespace minidl::testing {
namespace {

constexpr double kRtol = 1e-5;

struct AttentionCase {
  int B, T, H, D;
};

// qkv (B, T, (H + 2 Hkv) D) through the kernels against the CPU op, forward and backward, and the backward twice.
void check_forward_and_backward(int B, int T, int H, int Hkv, int D) {
  const int C = H * D, width = C + 2 * Hkv * D;
  const Tensor qkv = random_tensor({B, T, width}, uint64_t(T * 100 + D), DType::f32);
  const ops::AttentionForward want = ops::causal_attention_forward(qkv, H, Hkv);

  DeviceBuffer<float> dqkv(floats(qkv)), out(size_t(B) * T * C), lse(size_t(B) * H * T);
  ASSERT_EQ(ops::cuda::causal_attention_forward(dqkv.get(), out.get(), lse.get(), B, T, C, H, Hkv, nullptr),
            cudaSuccess);
  expect_close(doubles(out.host()), want.out.to_vector(), kRtol, "out");
  expect_close(doubles(lse.host()), want.lse.to_vector(), kRtol, "lse");

  const Tensor dout = random_tensor({B, T, C}, 99, DType::f32);
  const Tensor want_dqkv = ops::causal_attention_backward(dout, qkv, want.out, want.lse, H, Hkv);
  DeviceBuffer<float> ddout(floats(dout)), dqkv_out(size_t(B) * T * width);
  DeviceBuffer<float> scratch(ops::cuda::causal_attention_backward_scratch_floats(B, T, H));
  ASSERT_EQ(ops::cuda::causal_attention_backward(ddout.get(), dqkv.get(), out.get(), lse.get(), dqkv_out.get(),
                                                 scratch.get(), B, T, C, H, Hkv, nullptr),
            cudaSuccess);
  const std::vector<float> first = dqkv_out.host();
  expect_close(doubles(first), want_dqkv.to_vector(), kRtol, "dqkv");
  // No atomics: a second run gives the same bits.
  ASSERT_EQ(ops::cuda::causal_attention_backward(ddout.get(), dqkv.get(), out.get(), lse.get(), dqkv_out.get(),
                                                 scratch.get(), B, T, C, H, Hkv, nullptr),
            cudaSuccess);
  EXPECT_EQ(dqkv_out.host(), first);
}

class CudaAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchTheCpuOp) {
  const auto [B, T, H, D] = GetParam();
  check_forward_and_backward(B, T, H, H, D);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttentionCase{1, 1, 1, 16}, AttentionCase{2, 5, 3, 32},
                                           AttentionCase{1, 64, 2, 64}, AttentionCase{2, 70, 1, 16},
                                           AttentionCase{1, 130, 2, 32}, AttentionCase{1, 130, 1, 64},
                                           AttentionCase{1, 70, 2, 64}),
                         [](const auto& info) {
                           const AttentionCase& c = info.param;
                           return "batch" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" +
                                  std::to_string(c.H) + "_D" + std::to_string(c.D);
                         });

struct GroupedCase {
  int B, T, H, Hkv, D;
};

class CudaGroupedAttention : public ::testing::TestWithParam<GroupedCase> {};

// Query head h reads kv head h / (H / Hkv); a kv head's dK and dV sum its group's heads in one block.
TEST_P(CudaGroupedAttention, ForwardAndBackwardMatchTheCpuOp) {
  const auto [B, T, H, Hkv, D] = GetParam();
  check_forward_and_backward(B, T, H, Hkv, D);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGroupedAttention,
                         ::testing::Values(GroupedCase{2, 37, 6, 2, 16}, GroupedCase{1, 70, 6, 3, 32},
                                           GroupedCase{1, 33, 4, 1, 64}),
                         [](const auto& info) {
                           const GroupedCase& c = info.param;
                           return "batch" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" +
                                  std::to_string(c.H) + "_Hkv" + std::to_string(c.Hkv) + "_D" + std::to_string(c.D);
                         });

TEST(CudaAttentionDims, UnsupportedHeadDimensionIsAnError) {
  DeviceBuffer<float> qkv(3 * 24), out(24), lse(1), dqkv(3 * 24), scratch(1);
  EXPECT_EQ(ops::cuda::causal_attention_forward(qkv.get(), out.get(), lse.get(), 1, 1, 24, 1, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ops::cuda::causal_attention_backward(out.get(), qkv.get(), out.get(), lse.get(), dqkv.get(), scratch.get(),
                                                 1, 1, 24, 1, 1, nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaAttentionDims, QueryHeadsNotAMultipleOfKvHeadsIsAnError) {
  DeviceBuffer<float> qkv(3 * 16 + 2 * 2 * 16), out(3 * 16), lse(3), dqkv(3 * 16 + 2 * 2 * 16), scratch(3);
  EXPECT_EQ(ops::cuda::causal_attention_forward(qkv.get(), out.get(), lse.get(), 1, 1, 48, 3, 2, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ops::cuda::causal_attention_backward(out.get(), qkv.get(), out.get(), lse.get(), dqkv.get(), scratch.get(),
                                                 1, 1, 48, 3, 2, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace minidl::testing
