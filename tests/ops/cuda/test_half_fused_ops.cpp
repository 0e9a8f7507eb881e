// The 16-bit-native fused ops on device tensors (ops/cuda/tensor/layernorm.cpp, gelu.cpp): f16 and bf16 activations
// go straight to the kernels, with no f32 copies, against the same ops on the CPU; and the launch counters show it:
// one launch per forward, two per backward (the rows, then the fixed-order partial sums), no copies or syncs.
#include "core/cuda/cuda.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/matmul.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

void expect_only_launches(const cuda::Counters& c, int64_t launches, const std::string& what) {
  EXPECT_EQ(c.kernel_launches, launches) << what;
  EXPECT_EQ(c.memsets + c.host_syncs + c.h2d_copies + c.d2h_copies + c.d2d_copies, 0) << what;
}

TEST_F(CudaTensorOps, HalfLayerNormRunsNativelyAndMatchesTheCpu) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::string name = dtype_name(dt);
    const Tensor x = random_tensor({3, 5, 36}, 1, dt, 2.0), dy = random_tensor({3, 5, 36}, 2, dt);
    const Tensor w = random_tensor({36}, 3, DType::f32), b = random_tensor({36}, 4, DType::f32);
    const Tensor dx_ = x.to(kCuda), ddy = dy.to(kCuda), dw = w.to(kCuda), db = b.to(kCuda);
    const ops::LayerNormForward want = ops::layernorm_forward(x, w, b, 1e-5);
    ops::LayerNormForward got;
    expect_only_launches(counted([&] { got = ops::layernorm_forward(dx_, dw, db, 1e-5); }), 1,
                         "layernorm forward " + name);
    expect_device_matches(got.y, want.y, rtol_for(dt), "y " + name);
    expect_device_matches(got.rstd, want.rstd, 1e-5, "rstd " + name);

    const ops::LayerNormBackward want_grad = ops::layernorm_backward(dy, x, w, want.mean, want.rstd);
    ops::LayerNormBackward grad;
    expect_only_launches(counted([&] { grad = ops::layernorm_backward(ddy, dx_, dw, got.mean, got.rstd); }), 2,
                         "layernorm backward " + name);
    expect_device_matches(grad.dx, want_grad.dx, rtol_for(dt), "dx " + name);
    expect_device_matches(grad.dweight, want_grad.dweight, 1e-5, "dweight " + name);
    expect_device_matches(grad.dbias, want_grad.dbias, 1e-5, "dbias " + name);
  }
}

TEST_F(CudaTensorOps, HalfLayerNormTakesF32ParametersOnly) {
  const Tensor x = random_tensor({2, 8}, 5, DType::bf16).to(kCuda), w16 = random_tensor({8}, 6, DType::bf16);
  try {
    ops::layernorm_forward(x, w16.to(kCuda), w16.to(kCuda), 1e-5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layernorm: expected weight to have dtype f32 for x of dtype bf16, got bf16"), std::string::npos)
        << msg;
  }
}

TEST_F(CudaTensorOps, AddLayerNormIsOneLaunchEachWayAndMatchesTheCpu) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::string name = dtype_name(dt);
    const Tensor a = random_tensor({2, 7, 36}, 11, dt), b = random_tensor({2, 7, 36}, 12, dt);
    const Tensor dy = random_tensor({2, 7, 36}, 13, dt), dsum = random_tensor({2, 7, 36}, 14, dt);
    const Tensor w = random_tensor({36}, 15, DType::f32), bias = random_tensor({36}, 16, DType::f32);
    const Tensor da = a.to(kCuda), db = b.to(kCuda), ddy = dy.to(kCuda), ddsum = dsum.to(kCuda);
    const Tensor dw = w.to(kCuda), dbias = bias.to(kCuda);
    const ops::AddLayerNormForward want = ops::add_layernorm_forward(a, b, w, bias, 1e-5);
    ops::AddLayerNormForward got;
    expect_only_launches(counted([&] { got = ops::add_layernorm_forward(da, db, dw, dbias, 1e-5); }), 1,
                         "add_layernorm forward " + name);
    expect_device_matches(got.sum, want.sum, 0.0, "sum " + name);
    expect_device_matches(got.y, want.y, rtol_for(dt), "y " + name);

    const ops::LayerNormBackward want_grad = ops::add_layernorm_backward(dy, dsum, want.sum, w, want.mean, want.rstd);
    ops::LayerNormBackward grad;
    expect_only_launches(
        counted([&] { grad = ops::add_layernorm_backward(ddy, ddsum, got.sum, dw, got.mean, got.rstd); }), 2,
        "add_layernorm backward " + name);
    expect_device_matches(grad.dx, want_grad.dx, rtol_for(dt), "dx " + name);
    expect_device_matches(grad.dweight, want_grad.dweight, 1e-5, "dweight " + name);
    // Without a gradient from the sum's other uses: the plain layernorm gradient.
    const ops::LayerNormBackward alone = ops::add_layernorm_backward(ddy, Tensor(), got.sum, dw, got.mean, got.rstd);
    expect_device_matches(alone.dx, ops::layernorm_backward(dy, want.sum, w, want.mean, want.rstd).dx, rtol_for(dt),
                          "dx without dsum " + name);
  }
}

TEST_F(CudaTensorOps, HalfBiasGeluRunsNatively) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::string name = dtype_name(dt);
    const Tensor x = random_tensor({4, 3, 40}, 7, dt, 3.0), dy = random_tensor({4, 3, 40}, 8, dt);
    const Tensor bias = random_tensor({40}, 9, dt);
    const Tensor dx_ = x.to(kCuda), ddy = dy.to(kCuda), db = bias.to(kCuda);
    Tensor y;
    expect_only_launches(counted([&] { y = ops::bias_gelu_forward(dx_, db); }), 1, "bias_gelu forward " + name);
    expect_device_matches(y, ops::bias_gelu_forward(x, bias), rtol_for(dt), "y " + name);
    ops::BiasGeluBackward grad;
    expect_only_launches(counted([&] { grad = ops::bias_gelu_backward(ddy, dx_, db); }), 2,
                         "bias_gelu backward " + name);
    const ops::BiasGeluBackward want = ops::bias_gelu_backward(dy, x, bias);
    expect_device_matches(grad.dx, want.dx, rtol_for(dt), "dx " + name);
    expect_device_matches(grad.dbias, want.dbias, rtol_for(dt), "dbias " + name);
  }
}

// matmul_f32: 16-bit operands, f32 output written by the GEMM itself (one launch, no casts), equal to the CPU's
// unrounded f32 product, for every transpose of a weight-gradient-sized product and a batched one.
TEST_F(CudaTensorOps, HalfProductWithAnF32OutputIsOneGemmAndIsNotRounded) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::string name = dtype_name(dt);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor(ta ? Shape{33, 12} : Shape{12, 33}, 21, dt);
        const Tensor b = random_tensor(tb ? Shape{7, 33} : Shape{33, 7}, 22, dt);
        const Tensor da = a.to(kCuda), db = b.to(kCuda);
        Tensor got;
        expect_only_launches(counted([&] { got = ops::matmul_f32(da, db, ta, tb); }), 1, "matmul_f32 " + name);
        const Tensor want = ops::matmul(ops::upcast(a), ops::upcast(b), ta, tb);
        expect_device_matches(got, want, 1e-6, "matmul_f32 " + name);
        expect_device_matches(got, ops::matmul_f32(a, b, ta, tb), 1e-6, "matmul_f32 vs the CPU op " + name);
        // The rounded 16-bit product is a different tensor: the f32 output kept the digits.
        EXPECT_NE(got.to(Device::cpu()).to_vector(), ops::upcast(ops::matmul(a, b, ta, tb)).to_vector()) << name;
      }
    const Tensor a = random_tensor({3, 5, 9}, 23, dt), b = random_tensor({3, 9, 4}, 24, dt);
    expect_device_matches(ops::matmul_f32(a.to(kCuda), b.to(kCuda)), ops::matmul(ops::upcast(a), ops::upcast(b)), 1e-6,
                          "batched matmul_f32 " + name);
  }
}

}  // namespace
}  // namespace minidl::testing
