// The CUDA bias + GELU kernels (ops/cuda/bias_gelu.cu), run on the emulator, against ops::bias_gelu_forward and
// bias_gelu_backward: widths around the warp and the vector width, row counts around the 32-row partials.
#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/bias_gelu.h"
#include "ops/gelu.h"

namespace minidl::testing {
namespace {

constexpr double kRtol = 1e-5;

struct Shape2 {
  int64_t rows;
  int C;
};

class CudaBiasGelu : public ::testing::TestWithParam<Shape2> {};

TEST_P(CudaBiasGelu, ForwardAndBackwardMatchTheCpuOp) {
  const auto [rows, C] = GetParam();
  // Scale 4: the saturated tails of GELU (gate near 0 and 1) as well as its curved middle.
  const Tensor x = random_tensor({rows, C}, 11, DType::f32, 4.0), dy = random_tensor({rows, C}, 12, DType::f32);
  const Tensor b = random_tensor({C}, 13, DType::f32);
  const Tensor want = ops::bias_gelu_forward(x, b);
  const ops::BiasGeluBackward want_grad = ops::bias_gelu_backward(dy, x, b);

  DeviceBuffer<float> dx_in(floats(x)), db_in(floats(b)), ddy(floats(dy));
  DeviceBuffer<float> y(rows * C), dx(rows * C), dbias(C);
  DeviceBuffer<float> scratch(ops::cuda::bias_gelu_backward_scratch_floats(rows, C));
  ASSERT_EQ(ops::cuda::bias_gelu_forward(dx_in.get(), db_in.get(), y.get(), rows, C, nullptr), cudaSuccess);
  expect_close(doubles(y.host()), want.to_vector(), kRtol, "y");

  ASSERT_EQ(ops::cuda::bias_gelu_backward(ddy.get(), dx_in.get(), db_in.get(), dx.get(), dbias.get(), scratch.get(),
                                          rows, C, nullptr),
            cudaSuccess);
  expect_close(doubles(dx.host()), want_grad.dx.to_vector(), kRtol, "dx");
  expect_close(doubles(dbias.host()), want_grad.dbias.to_vector(), kRtol, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaBiasGelu,
                         ::testing::Values(Shape2{1, 1}, Shape2{40, 1}, Shape2{3, 31}, Shape2{33, 33}, Shape2{65, 100},
                                           Shape2{7, 384}, Shape2{2, 1027}),
                         [](const auto& info) {
                           return "rows" + std::to_string(info.param.rows) + "_C" + std::to_string(info.param.C);
                         });

// A bias whose address is not 16-byte aligned takes the scalar path, with the same result.
TEST(CudaBiasGelu, UnalignedBiasMatchesTheCpuOp) {
  const int64_t rows = 5;
  const int C = 64;
  const Tensor x = random_tensor({rows, C}, 21, DType::f32), b = random_tensor({C}, 22, DType::f32);
  std::vector<float> shifted = floats(b);
  shifted.insert(shifted.begin(), 0.0f);
  DeviceBuffer<float> dx_in(floats(x)), db_in(shifted), y(rows * C);
  ASSERT_EQ(ops::cuda::bias_gelu_forward(dx_in.get(), db_in.get() + 1, y.get(), rows, C, nullptr), cudaSuccess);
  expect_close(doubles(y.host()), ops::bias_gelu_forward(x, b).to_vector(), kRtol, "y");
}

}  // namespace
}  // namespace minidl::testing
