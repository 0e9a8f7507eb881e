// The 16-bit paths of the fused layernorm and bias + GELU kernels (ops/cuda/layernorm.cu, bias_gelu.cu), run on the
// emulator with f16 and bf16 storage read and written directly, against the CPU ops on the same 16-bit values (f32
// math on their exact f32 copies, then one rounding). The GPU's f32 statistics differ from the CPU's f64 ones by
// ~1e-6 relative, which can move a result across a rounding boundary: 16-bit outputs are held to one unit in the
// last place of their type, f32 outputs (mean, rstd, dweight, dbias before rounding) to 1e-5. Widths below, at and
// off the 4-element vector (1, 3, 31, 33, 100, 384), single rows and enough rows for several partials.
#include <cmath>
#include <cstring>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/bias_gelu.h"
#include "ops/cuda/layernorm.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"

namespace minidl::testing {
namespace {

struct Shape2 {
  int64_t rows;
  int C;
};

// One unit in the last place, relative to the value: 2^-7 for bf16 (8 significant bits), 2^-10 for f16; for f32
// the kernels' usual 1e-5.
double relative_ulp(DType dt) { return dt == DType::bf16 ? 1.0 / 128 : dt == DType::f16 ? 1.0 / 1024 : 1e-5; }

// The device elements of a 16-bit CPU tensor (the same bits), and back.
template <class H>
std::vector<H> bits_of(const Tensor& t16) {
  std::vector<H> v(size_t(t16.numel()));
  std::memcpy(v.data(), t16.contiguous().raw_data(), v.size() * sizeof(H));
  return v;
}
template <class H>
Tensor tensor_of(const std::vector<H>& v, const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt, Device::cpu());
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(H));
  return t;
}

// |got - want| <= ulp * |want| + atol elementwise: each 16-bit element within one rounding of the reference.
void expect_within_ulp(const Tensor& got, const Tensor& want, double ulp, double atol, const std::string& what) {
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], ulp * std::abs(w[i]) + atol) << what << " element " << i;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

template <class H>
void check_layernorm(DType dt, int64_t rows, int C) {
  const Tensor x = random_tensor({rows, C}, 1, dt, 2.0), dy = random_tensor({rows, C}, 2, dt);
  const Tensor w = random_tensor({C}, 3, DType::f32), b = random_tensor({C}, 4, DType::f32);
  const ops::LayerNormForward want = ops::layernorm_forward(x, w, b, 1e-5);
  const ops::LayerNormBackward want_grad = ops::layernorm_backward(dy, x, w, want.mean, want.rstd);
  ASSERT_EQ(want.y.dtype(), dt);
  ASSERT_EQ(want.mean.dtype(), DType::f32);

  DeviceBuffer<H> dx_in(bits_of<H>(x)), ddy(bits_of<H>(dy)), y(size_t(rows * C)), dx(size_t(rows * C));
  DeviceBuffer<float> dw(floats(w)), db(floats(b)), mean(rows), rstd(rows), dweight(C), dbias(C);
  DeviceBuffer<float> scratch(ops::cuda::layernorm_backward_scratch_floats(rows, C));
  ASSERT_EQ(ops::cuda::layernorm_forward(dx_in.get(), dw.get(), db.get(), y.get(), mean.get(), rstd.get(), rows, C,
                                         1e-5f, nullptr),
            cudaSuccess);
  const double y_atol = 1e-5 * max_abs(want.y);
  expect_within_ulp(tensor_of(y.host(), {rows, C}, dt), want.y, relative_ulp(dt), y_atol, "y");
  expect_close(doubles(mean.host()), want.mean.to_vector(), 1e-5, "mean");
  expect_close(doubles(rstd.host()), want.rstd.to_vector(), 1e-5, "rstd");

  ASSERT_EQ(ops::cuda::layernorm_backward(ddy.get(), dx_in.get(), dw.get(), mean.get(), rstd.get(), dx.get(),
                                          dweight.get(), dbias.get(), scratch.get(), rows, C, nullptr),
            cudaSuccess);
  // dx is a difference of terms of size rstd * |dy * w|: the absolute slack is relative to that size.
  const double dx_atol = 1e-5 * max_abs(want.rstd) * max_abs(dy) * max_abs(w);
  expect_within_ulp(tensor_of(dx.host(), {rows, C}, dt), want_grad.dx, relative_ulp(dt), dx_atol, "dx");
  expect_close(doubles(dweight.host()), want_grad.dweight.to_vector(), 1e-5, "dweight");
  expect_close(doubles(dbias.host()), want_grad.dbias.to_vector(), 1e-5, "dbias");
}

template <class H>
void check_bias_gelu(DType dt, int64_t rows, int C) {
  const Tensor x = random_tensor({rows, C}, 11, dt, 4.0), dy = random_tensor({rows, C}, 12, dt);
  const Tensor b = random_tensor({C}, 13, dt);
  const Tensor want = ops::bias_gelu_forward(x, b);
  const ops::BiasGeluBackward want_grad = ops::bias_gelu_backward(dy, x, b);

  DeviceBuffer<H> dx_in(bits_of<H>(x)), ddy(bits_of<H>(dy)), dbias_in(bits_of<H>(b));
  DeviceBuffer<H> y(size_t(rows * C)), dx(size_t(rows * C)), dbias(static_cast<size_t>(C));
  DeviceBuffer<float> scratch(ops::cuda::bias_gelu_backward_scratch_floats(rows, C));
  ASSERT_EQ(ops::cuda::bias_gelu_forward(dx_in.get(), dbias_in.get(), y.get(), rows, C, nullptr), cudaSuccess);
  // The same f32 math on the same values (ops/kernels/gelu.h), up to the exp of each backend: a few f32 ulp.
  expect_within_ulp(tensor_of(y.host(), {rows, C}, dt), want, relative_ulp(dt), 1e-6 * max_abs(want), "y");
  ASSERT_EQ(ops::cuda::bias_gelu_backward(ddy.get(), dx_in.get(), dbias_in.get(), dx.get(), dbias.get(), scratch.get(),
                                          rows, C, nullptr),
            cudaSuccess);
  expect_within_ulp(tensor_of(dx.host(), {rows, C}, dt), want_grad.dx, relative_ulp(dt), 1e-6 * max_abs(want_grad.dx),
                    "dx");
  // dbias: f32 sums in another order than the CPU's, rounded once: one ulp of the 16-bit type, plus the f32 sum's
  // own error relative to the column's magnitude.
  ASSERT_EQ(want_grad.dbias.dtype(), dt);
  expect_within_ulp(tensor_of(dbias.host(), {C}, dt), want_grad.dbias, relative_ulp(dt),
                    1e-5 * max_abs(want_grad.dbias), "dbias");
}

// add_layernorm: sum = a + b rounded to the storage type, then layernorm(sum); backward adds dsum to dx. The sum
// has the CPU's bits exactly (one f32 add, one rounding); the rest as check_layernorm.
template <class H>
void check_add_layernorm(DType dt, int64_t rows, int C) {
  const Tensor a = random_tensor({rows, C}, 21, dt, 2.0), b = random_tensor({rows, C}, 22, dt);
  const Tensor dy = random_tensor({rows, C}, 23, dt), dsum = random_tensor({rows, C}, 24, dt);
  const Tensor w = random_tensor({C}, 25, DType::f32), bias = random_tensor({C}, 26, DType::f32);
  const ops::AddLayerNormForward want = ops::add_layernorm_forward(a, b, w, bias, 1e-5);
  const ops::LayerNormBackward want_grad = ops::add_layernorm_backward(dy, dsum, want.sum, w, want.mean, want.rstd);

  DeviceBuffer<H> da(bits_of<H>(a)), db(bits_of<H>(b)), ddy(bits_of<H>(dy)), ddsum(bits_of<H>(dsum));
  DeviceBuffer<H> sum(size_t(rows * C)), y(size_t(rows * C)), dx(size_t(rows * C));
  DeviceBuffer<float> dw(floats(w)), dbias_in(floats(bias)), mean(rows), rstd(rows), dweight(C), dbias(C);
  DeviceBuffer<float> scratch(ops::cuda::layernorm_backward_scratch_floats(rows, C));
  ASSERT_EQ(ops::cuda::add_layernorm_forward(da.get(), db.get(), dw.get(), dbias_in.get(), sum.get(), y.get(),
                                             mean.get(), rstd.get(), rows, C, 1e-5f, nullptr),
            cudaSuccess);
  EXPECT_EQ(tensor_of(sum.host(), {rows, C}, dt).to_vector(), want.sum.to_vector()) << "sum";
  expect_within_ulp(tensor_of(y.host(), {rows, C}, dt), want.y, relative_ulp(dt), 1e-5 * max_abs(want.y), "y");
  expect_close(doubles(rstd.host()), want.rstd.to_vector(), 1e-5, "rstd");

  ASSERT_EQ(ops::cuda::add_layernorm_backward(ddy.get(), sum.get(), dw.get(), mean.get(), rstd.get(), ddsum.get(),
                                              dx.get(), dweight.get(), dbias.get(), scratch.get(), rows, C, nullptr),
            cudaSuccess);
  // Two roundings (the layernorm gradient, then its sum with dsum), each within one ulp of the larger term.
  const double dx_atol = 1e-5 * max_abs(want.rstd) * max_abs(dy) * max_abs(w) +
                         2 * relative_ulp(dt) * (max_abs(dsum) + max_abs(want_grad.dx));
  expect_within_ulp(tensor_of(dx.host(), {rows, C}, dt), want_grad.dx, relative_ulp(dt), dx_atol, "dx");
  expect_close(doubles(dweight.host()), want_grad.dweight.to_vector(), 1e-5, "dweight");
  expect_close(doubles(dbias.host()), want_grad.dbias.to_vector(), 1e-5, "dbias");
}

class CudaHalfFused : public ::testing::TestWithParam<Shape2> {};

TEST_P(CudaHalfFused, AddLayerNormMatchesTheCpuOp) {
  {
    SCOPED_TRACE("f32");
    check_add_layernorm<float>(DType::f32, GetParam().rows, GetParam().C);
  }
  {
    SCOPED_TRACE("bf16");
    check_add_layernorm<__nv_bfloat16>(DType::bf16, GetParam().rows, GetParam().C);
  }
  {
    SCOPED_TRACE("f16");
    check_add_layernorm<__half>(DType::f16, GetParam().rows, GetParam().C);
  }
}

TEST_P(CudaHalfFused, LayerNormBf16MatchesTheCpuOp) {
  check_layernorm<__nv_bfloat16>(DType::bf16, GetParam().rows, GetParam().C);
}
TEST_P(CudaHalfFused, LayerNormF16MatchesTheCpuOp) {
  check_layernorm<__half>(DType::f16, GetParam().rows, GetParam().C);
}
TEST_P(CudaHalfFused, BiasGeluBf16MatchesTheCpuOp) {
  check_bias_gelu<__nv_bfloat16>(DType::bf16, GetParam().rows, GetParam().C);
}
TEST_P(CudaHalfFused, BiasGeluF16MatchesTheCpuOp) {
  check_bias_gelu<__half>(DType::f16, GetParam().rows, GetParam().C);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaHalfFused,
                         ::testing::Values(Shape2{1, 1}, Shape2{1, 100}, Shape2{3, 31}, Shape2{9, 33}, Shape2{5, 3},
                                           Shape2{70, 100}, Shape2{8, 384}, Shape2{300, 33}),
                         [](const auto& info) {
                           return "rows" + std::to_string(info.param.rows) + "_C" + std::to_string(info.param.C);
                         });

}  // namespace
}  // namespace minidl::testing
