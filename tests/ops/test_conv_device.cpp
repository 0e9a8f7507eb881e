// conv2d and max_pool2d on CUDA devices equal the CPU ops (ops/conv.h). Built twice, like core's device tests:
// test_conv_device on the emulated backend (the CPU kernels on emulated device memory; always runs) and
// test_conv_device_gpu on the real one (cuDNN; skips without a GPU, and allows for cuDNN's TF32 math).
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/conv.h"
#include "tests/core/cuda/cuda_test.h"
#include "tests/ops/nn_test_util.h"

namespace minidl {
namespace {

using testing::expect_close;
using testing::random_tensor;

const Device kCuda = Device::cuda(0);
#if defined(MINIDL_TEST_EMULATED_CUDA)
constexpr double kRtol = 1e-6;
#else
constexpr double kRtol = 5e-3;
#endif

class ConvDevice : public testing::CudaTest {};

TEST_F(ConvDevice, Conv2dForwardAndBackwardMatchTheCpu) {
  struct Case {
    Shape x, w;
    ops::Conv2dOptions o;
  };
  for (const Case& c : {Case{{3, 9, 7, 3}, {5, 3, 3, 3}, {1, 1, 1}}, Case{{2, 8, 8, 4}, {6, 3, 2, 4}, {2, 0, 1}},
                        Case{{2, 6, 6, 5}, {3, 1, 1, 5}, {1, 0, 1}}, Case{{1, 9, 9, 2}, {4, 3, 3, 2}, {1, 2, 2}}}) {
    SCOPED_TRACE(::testing::Message() << "x " << c.x << " w " << c.w << " stride " << c.o.stride);
    Tensor x = random_tensor(c.x, 1, DType::f32), w = random_tensor(c.w, 2, DType::f32);
    Tensor b = random_tensor({c.w[0]}, 3, DType::f32);
    Tensor y = ops::conv2d_forward(x, w, b, c.o);
    Tensor dy = random_tensor(y.shape(), 4, DType::f32);
    ops::Conv2dBackward g = ops::conv2d_backward(dy, x, w, c.o, true);

    Tensor yd = ops::conv2d_forward(x.to(kCuda), w.to(kCuda), b.to(kCuda), c.o);
    EXPECT_EQ(yd.device(), kCuda);
    ops::Conv2dBackward gd = ops::conv2d_backward(dy.to(kCuda), x.to(kCuda), w.to(kCuda), c.o, true);
    expect_close(yd.to_vector(), y.to_vector(), kRtol, "y");
    expect_close(gd.dx.to_vector(), g.dx.to_vector(), kRtol, "dx");
    expect_close(gd.dweight.to_vector(), g.dweight.to_vector(), kRtol, "dweight");
    expect_close(gd.dbias.to_vector(), g.dbias.to_vector(), kRtol, "dbias");
    EXPECT_FALSE(ops::conv2d_backward(dy.to(kCuda), x.to(kCuda), w.to(kCuda), c.o, false).dx.defined());
  }
}

TEST_F(ConvDevice, MaxPool2dForwardAndBackwardMatchTheCpu) {
  for (ops::Pool2dOptions o : {ops::Pool2dOptions{2, 2}, ops::Pool2dOptions{3, 2}}) {
    Tensor x = random_tensor({2, 9, 8, 5}, 5, DType::f32);
    Tensor y = ops::max_pool2d_forward(x, o);
    Tensor dy = random_tensor(y.shape(), 6, DType::f32);
    Tensor yd = ops::max_pool2d_forward(x.to(kCuda), o);
    EXPECT_EQ(yd.to_vector(), y.to_vector());
    Tensor dxd = ops::max_pool2d_backward(dy.to(kCuda), x.to(kCuda), yd, o);
    expect_close(dxd.to_vector(), ops::max_pool2d_backward(dy, x, y, o).to_vector(), 1e-6, "dx");
  }
}

// The differentiable ops on device tensors: gradients land on the device and equal the CPU's. Conv and pool are
// checked apart: pooling after a TF32 convolution could pick another of two nearly equal maxima than the CPU.
TEST_F(ConvDevice, AutogradThroughConvAndPoolStaysOnTheDevice) {
  Tensor x = random_tensor({2, 8, 8, 3}, 7, DType::f32), w = random_tensor({4, 3, 3, 3}, 8, DType::f32);
  Tensor b = random_tensor({4}, 9, DType::f32);
  auto run = [&](Device d, bool pool) {
    Tensor xd = x.to(d).detach().set_requires_grad(true), wd = w.to(d).detach().set_requires_grad(true);
    Tensor bd = b.to(d).detach().set_requires_grad(true);
    Tensor y = pool ? max_pool2d(xd, 2, 2) : conv2d(xd, wd, bd, 1, 1);
    autograd::backward({y}, {random_tensor(y.shape(), 10, DType::f32).to(d)});
    EXPECT_EQ(xd.grad().device(), d);
    if (pool) return std::vector<Tensor>{y, xd.grad()};
    EXPECT_EQ(wd.grad().device(), d);
    return std::vector<Tensor>{y, xd.grad(), wd.grad(), bd.grad()};
  };
  for (bool pool : {false, true}) {
    std::vector<Tensor> cpu = run(Device::cpu(), pool), dev = run(kCuda, pool);
    for (size_t i = 0; i < cpu.size(); ++i)
      expect_close(dev[i].to_vector(), cpu[i].to_vector(), kRtol, (pool ? "pool " : "conv ") + std::to_string(i));
  }
}

TEST_F(ConvDevice, TheCudaKernelTakesF32) {
  Tensor x = Tensor::zeros({1, 4, 4, 2}, DType::f64, kCuda), w = Tensor::zeros({3, 3, 3, 2}, DType::f64, kCuda);
  testing::expect_error([&] { ops::conv2d_forward(x, w, Tensor(), {}); }, {"conv2d", "f32", "f64", "cuda:0"});
}

}  // namespace
}  // namespace minidl
