// ops/reduce.h on device tensors (ops/cuda/reduce.cu through ops/cuda/tensor/reduce.cpp), against the same ops on
// the CPU: full reductions over one and several blocks, every dimension with and without keepdim (rows reduced by
// a warp, columns by a block, columns in chunks), ties and NaN for max, max_backward, 16-bit sums, the sum of
// squares of gradient clipping, the same bits on every run, and autograd's backward through them.
#include <cmath>

#include "autograd/functions.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

const Shape kShapes[] = {{3, 5, 7}, {257}, {1, 33}, {33, 1}, {4, 100}, {2, 300, 3}, {6000}, {}};

double sum_abs(const Tensor& x) {
  double s = 1e-30;
  for (double v : x.to_vector()) s += std::abs(v);
  return s;
}

// A sum is compared to the CPU's (accumulated in double) within rtol of the sum of magnitudes: f32 partial sums
// round relative to what they add, not to the (possibly cancelling) total.
void expect_sum_matches(const Tensor& got, const Tensor& want, double scale, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(got.device(), kCuda) << what;
  const Values g = got.to(Device::cpu()).to_vector(), w = want.to_vector();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5 * scale) << what << " element " << i;
}

TEST_F(CudaTensorOps, FullReductionsMatchTheCpu) {
  for (const Shape& shape : kShapes) {
    const std::string what = shape_name(shape);
    const Tensor x = random_tensor(shape, 1, DType::f32), dx = x.to(kCuda);
    expect_sum_matches(ops::sum(dx), ops::sum(x), sum_abs(x), "sum " + what);
    expect_sum_matches(ops::mean(dx), ops::mean(x), sum_abs(x) / double(x.numel()), "mean " + what);
    expect_device_matches(ops::max(dx), ops::max(x), 0, "max " + what);
    const Tensor first = ops::sum(dx);
    EXPECT_EQ(ops::sum(dx).item(), first.item()) << "sum " << what << " differs between runs";
  }
  expect_device_matches(ops::sum(Tensor::zeros({0, 3}, DType::f32, kCuda)), Tensor::scalar(0.0), 0, "empty sum");
  const Tensor x = random_tensor({20, 30}, 2, DType::f32);
  expect_sum_matches(ops::sum(x.to(kCuda).transpose(0, 1)), ops::sum(x), sum_abs(x), "sum of a view");
}

TEST_F(CudaTensorOps, SumOfSquaresForGradientClipping) {
  const Tensor g = random_tensor({37, 65}, 3, DType::f32, 1e-2);
  const Tensor got = ops::sum(ops::square(g.to(kCuda)));
  expect_device_matches(got, ops::sum(ops::square(g)), 1e-5, "sum(square(g))");
  EXPECT_NEAR(std::sqrt(got.item()), std::sqrt(ops::sum(ops::square(g)).item()), 1e-6);
}

TEST_F(CudaTensorOps, ReductionsOverADimensionMatchTheCpu) {
  for (const Shape& shape : kShapes) {
    const Tensor x = random_tensor(shape, 4, DType::f32), dx = x.to(kCuda);
    for (int d = 0; d < shape.size(); ++d) {
      for (bool keepdim : {false, true}) {
        const std::string what = shape_name(shape) + " dim " + std::to_string(d) + (keepdim ? " keepdim" : "");
        const double n = double(shape[d]);
        expect_sum_matches(ops::sum(dx, d, keepdim), ops::sum(x, d, keepdim), n, "sum " + what);
        expect_sum_matches(ops::mean(dx, d, keepdim), ops::mean(x, d, keepdim), 1.0, "mean " + what);
        const ops::MaxResult got = ops::max(dx, d, keepdim), want = ops::max(x, d, keepdim);
        expect_device_matches(got.values, want.values, 0, "max values " + what);
        EXPECT_EQ(got.indices.to(Device::cpu()).to_vector(), want.indices.to_vector()) << "max indices " << what;
      }
    }
  }
  // Negative dims, a strided view, and a dimension of size 0 (sums to zeros).
  const Tensor x = random_tensor({7, 9}, 5, DType::f32);
  expect_sum_matches(ops::sum(x.to(kCuda), -1), ops::sum(x, -1), 9, "sum dim -1");
  expect_sum_matches(ops::sum(x.to(kCuda).transpose(0, 1), 1), ops::sum(x.transpose(0, 1), 1), 9, "sum of a view");
  expect_device_matches(ops::sum(Tensor::zeros({3, 0, 2}, DType::f32, kCuda), 1), Tensor::zeros({3, 2}), 0,
                        "sum over an empty dimension");
}

TEST_F(CudaTensorOps, MaxKeepsTheFirstMaximumAndPropagatesNaN) {
  // Few distinct values: many ties, in rows (warp kernel) and columns (block kernel).
  Values v = random_values(40 * 70, 6);
  for (double& e : v) e = std::round(e);
  v[5 * 70 + 3] = NAN;
  v[5 * 70 + 60] = NAN;
  v[17 * 70 + 3] = NAN;
  const Tensor x = Tensor::from_vector(v, {40, 70}), dx = x.to(kCuda);
  for (int d : {0, 1}) {
    const ops::MaxResult got = ops::max(dx, d), want = ops::max(x, d);
    const Values gv = got.values.to(Device::cpu()).to_vector(), wv = want.values.to_vector();
    for (size_t i = 0; i < wv.size(); ++i)
      EXPECT_TRUE(gv[i] == wv[i] || (std::isnan(gv[i]) && std::isnan(wv[i]))) << "dim " << d << " value " << i;
    EXPECT_EQ(got.indices.to(Device::cpu()).to_vector(), want.indices.to_vector()) << "dim " << d;
  }
  EXPECT_TRUE(std::isnan(ops::max(dx).item()));
}

TEST_F(CudaTensorOps, MaxBackwardScattersTheGradient) {
  const Tensor x = random_tensor({3, 5, 7}, 7, DType::f32);
  for (int d = 0; d < 3; ++d) {
    const ops::MaxResult m = ops::max(x, d);
    const Tensor g = random_tensor(m.values.shape(), 8, DType::f32);
    expect_device_matches(ops::max_backward(g.to(kCuda), m.indices.to(kCuda), x.shape(), d),
                          ops::max_backward(g, m.indices, x.shape(), d), 0, "dim " + std::to_string(d));
  }
}

TEST_F(CudaTensorOps, SixteenBitSumsAccumulateInF32) {
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor x = random_tensor({9, 40}, 9, dt), dx = x.to(kCuda);
    const std::string name(dtype_name(dt));
    expect_device_matches(ops::sum(dx), ops::sum(x), 2 * rtol_for(dt), "sum " + name);
    expect_device_matches(ops::mean(dx), ops::mean(x), 2 * rtol_for(dt), "mean " + name);
    expect_device_matches(ops::sum(dx, 0), ops::sum(x, 0), 2 * rtol_for(dt), "sum dim 0 " + name);
    expect_device_matches(ops::mean(dx, 1, true), ops::mean(x, 1, true), 2 * rtol_for(dt), "mean dim 1 " + name);
  }
  const Tensor h = random_tensor({4}, 10, DType::bf16).to(kCuda);
  expect_error([&] { ops::max(h); }, {"max", "bf16", "cuda:0"});
  expect_error([&] { ops::sum(random_tensor({4}, 11, DType::f64).to(kCuda)); }, {"sum", "f64", "cuda:0"});
}

// The autograd functions are written in ops: on device tensors their backward runs these kernels too (sum_to_shape
// for broadcast inputs, broadcast_to for reductions, max_backward, add_ when gradients accumulate).
TEST_F(CudaTensorOps, AutogradThroughDeviceOpsMatchesTheCpu) {
  const Tensor x0 = random_tensor({4, 6}, 12, DType::f32), b0 = random_tensor({6}, 13, DType::f32);
  auto grads = [](Device device, const Tensor& x_init, const Tensor& b_init) {
    Tensor x = x_init.to(device).detach(), b = b_init.to(device).detach();
    x.set_requires_grad(true);
    b.set_requires_grad(true);
    for (int step = 0; step < 2; ++step) {  // the second backward accumulates into the gradients
      Tensor h = mul(add(x, b), tanh(x));
      Tensor loss = add(add(sum(h), mean(max(exp(mul(x, 0.5)), 1))), mean(sum(sqrt(add(square(x), 1.0)), 0)));
      loss = add(loss, sum(mul(softmax(h), bias_gelu(x, b))));
      loss.backward();
    }
    return std::vector<Tensor>{x.grad(), b.grad()};
  };
  const std::vector<Tensor> want = grads(Device::cpu(), x0, b0), got = grads(kCuda, x0, b0);
  expect_device_matches(got[0], want[0], 1e-5, "dx");
  expect_device_matches(got[1], want[1], 1e-5, "db");
}

}  // namespace
}  // namespace minidl::testing
