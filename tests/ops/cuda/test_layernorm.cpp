// The CUDA layer norm kernels (ops/cuda/layernorm.cu), run on the emulator, against ops::layernorm_forward and
// layernorm_backward: widths around the warp (1, 31, 33), vectorised widths (100, 384), ragged row counts, and
// enough rows that each warp of the backward handles several; and rows of x of size 4e-3, whose variance (~5e-6) is
// below epsilon (1e-5), where epsilon outside the square root would change rstd by 70% (at size 2 only by 1e-5).
#include <algorithm>
#include <cmath>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/layernorm.h"
#include "ops/layernorm.h"

namespace minidl::testing {
namespace {

constexpr float kEps = 1e-5f;
constexpr double kRtol = 1e-5;

struct Shape2 {
  int64_t rows;
  int C;
  double scale = 2.0;  // of x's values
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

class CudaLayerNorm : public ::testing::TestWithParam<Shape2> {};

TEST_P(CudaLayerNorm, ForwardAndBackwardMatchTheCpuOp) {
  const auto [rows, C, scale] = GetParam();
  const Tensor x = random_tensor({rows, C}, 1, DType::f32, scale), dy = random_tensor({rows, C}, 2, DType::f32);
  const Tensor w = random_tensor({C}, 3, DType::f32), b = random_tensor({C}, 4, DType::f32);
  const ops::LayerNormForward want = ops::layernorm_forward(x, w, b, kEps);
  const ops::LayerNormBackward want_grad = ops::layernorm_backward(dy, x, w, want.mean, want.rstd);

  DeviceBuffer<float> dx_in(floats(x)), dw_in(floats(w)), db_in(floats(b)), ddy(floats(dy));
  DeviceBuffer<float> y(rows * C), mean(rows), rstd(rows), dx(rows * C), dweight(C), dbias(C);
  DeviceBuffer<float> scratch(ops::cuda::layernorm_backward_scratch_floats(rows, C));
  ASSERT_EQ(ops::cuda::layernorm_forward(dx_in.get(), dw_in.get(), db_in.get(), y.get(), mean.get(), rstd.get(), rows,
                                         C, kEps, nullptr),
            cudaSuccess);
  expect_close(doubles(y.host()), want.y.to_vector(), kRtol, "y");
  expect_close(doubles(mean.host()), want.mean.to_vector(), kRtol, "mean");
  expect_close(doubles(rstd.host()), want.rstd.to_vector(), kRtol, "rstd");

  ASSERT_EQ(ops::cuda::layernorm_backward(ddy.get(), dx_in.get(), dw_in.get(), mean.get(), rstd.get(), dx.get(),
                                          dweight.get(), dbias.get(), scratch.get(), rows, C, nullptr),
            cudaSuccess);
  // dx is a difference of terms of size rstd * |dy * w| (exactly 0 for C = 1, where the CPU leaves rounding
  // noise): the tolerance is relative to that size, not to dx's.
  const std::vector<double> want_dx = want_grad.dx.to_vector();
  const std::vector<float> got_dx = dx.host();
  const double dx_scale = max_abs(want.rstd.to_vector()) * max_abs(dy.to_vector()) * max_abs(w.to_vector());
  for (size_t i = 0; i < want_dx.size(); ++i)
    ASSERT_NEAR(got_dx[i], want_dx[i], kRtol * dx_scale) << "dx element " << i;
  expect_close(doubles(dweight.host()), want_grad.dweight.to_vector(), kRtol, "dweight");
  expect_close(doubles(dbias.host()), want_grad.dbias.to_vector(), kRtol, "dbias");

  // The partial sums are added in a fixed order: a second run gives the same bits.
  const std::vector<float> first = dweight.host();
  ASSERT_EQ(ops::cuda::layernorm_backward(ddy.get(), dx_in.get(), dw_in.get(), mean.get(), rstd.get(), dx.get(),
                                          dweight.get(), dbias.get(), scratch.get(), rows, C, nullptr),
            cudaSuccess);
  EXPECT_EQ(dweight.host(), first);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLayerNorm,
                         ::testing::Values(Shape2{1, 1}, Shape2{5, 1}, Shape2{3, 31}, Shape2{9, 33}, Shape2{17, 100},
                                           Shape2{8, 384}, Shape2{1100, 33}, Shape2{2063, 4}, Shape2{9, 33, 4e-3},
                                           Shape2{17, 100, 4e-3}),
                         [](const auto& info) {
                           return "rows" + std::to_string(info.param.rows) + "_C" + std::to_string(info.param.C) +
                                  (info.param.scale < 1 ? "_small" : "");
                         });

}  // namespace
}  // namespace minidl::testing
