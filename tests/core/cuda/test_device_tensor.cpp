// Device tensors on the emulated CUDA backend: transfers bit for bit, cross-device copies of strided views,
// factories, autograd through to(device), and ops that have no CUDA kernel refusing device tensors by name.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "cuda_test.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);

class DeviceTensor : public testing::CudaTest {};

// A CPU tensor of `shape` whose bytes are random (every bit pattern: NaN payloads, subnormals, -0).
Tensor random_bytes(const Shape& shape, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dt);
  std::mt19937 gen(seed);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(gen());
  return t;
}

std::vector<double> arange_values(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return v;
}

void expect_throws_with(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_F(DeviceTensor, RoundTripIsBitwiseForEveryDtype) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{1}, Shape{3, 5, 7}}) {
      Tensor host = random_bytes(shape, dt, 7);
      Tensor dev = host.to(kCuda);
      EXPECT_EQ(dev.device(), kCuda);
      EXPECT_EQ(dev.dtype(), dt);
      EXPECT_EQ(dev.shape(), shape);
      Tensor back = dev.to(Device::cpu());
      EXPECT_TRUE(back.device().is_cpu());
      ASSERT_EQ(back.nbytes(), host.nbytes());
      EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0) << dt << " " << shape;
    }
  }
}

TEST_F(DeviceTensor, FactoriesAndHostReads) {
  Tensor z = Tensor::zeros({3, 4}, DType::f32, kCuda);
  EXPECT_EQ(z.to_vector(), std::vector<double>(12, 0.0));
  Tensor f = Tensor::full({2, 3}, 2.5, DType::bf16, kCuda);
  EXPECT_EQ(f.to_vector(), std::vector<double>(6, 2.5));
  EXPECT_EQ(Tensor::ones({1}, DType::i64, kCuda).item(), 1.0);
  Tensor e = Tensor::empty({0}, DType::f32, kCuda);
  EXPECT_TRUE(e.to_vector().empty());
  Tensor x = Tensor::from_vector(arange_values(6), {2, 3}).to(kCuda);
  x.narrow(1, 1, 1).fill_(-1.0);  // a strided fill on the device
  EXPECT_EQ(x.to_vector(), (std::vector<double>{0, -1, 2, 3, -1, 5}));
  std::ostringstream os;
  os << x;
  EXPECT_NE(os.str().find("device=cuda:0"), std::string::npos) << os.str();
}

TEST_F(DeviceTensor, CopyAcrossDevicesOfStridedViews) {
  Tensor a = Tensor::from_vector(arange_values(24), {4, 6});
  std::vector<double> at = a.transpose(0, 1).to_vector();

  // strided CPU source -> contiguous device destination
  Tensor d1 = Tensor::empty({6, 4}, DType::f32, kCuda);
  d1.copy_(a.transpose(0, 1));
  EXPECT_EQ(d1.to_vector(), at);

  // strided device source -> contiguous CPU destination
  Tensor da = a.to(kCuda);
  Tensor h = Tensor::empty({6, 4});
  h.copy_(da.transpose(0, 1));
  EXPECT_EQ(h.to_vector(), at);
  EXPECT_EQ(da.transpose(0, 1).to(Device::cpu()).to_vector(), at);

  // CPU view -> strided device destination: only the view's elements change
  Tensor dz = Tensor::zeros({4, 6}, DType::f32, kCuda);
  dz.narrow(1, 2, 3).copy_(a.narrow(1, 0, 3));
  std::vector<double> expect(24, 0.0);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) expect[size_t(r * 6 + 2 + c)] = double(r * 6 + c);
  EXPECT_EQ(dz.to_vector(), expect);

  // device view -> device view, and device -> device with a dtype conversion
  Tensor dd = Tensor::zeros({6, 4}, DType::f32, kCuda);
  dd.copy_(da.transpose(0, 1));
  EXPECT_EQ(dd.to_vector(), at);
  Tensor half = Tensor::empty({4, 6}, DType::f16, kCuda);
  half.copy_(a);
  EXPECT_EQ(half.to_vector(), a.to_vector());
  Tensor back = Tensor::empty({4, 6}, DType::f64);
  back.copy_(half);
  EXPECT_EQ(back.to_vector(), a.to_vector());
}

TEST_F(DeviceTensor, ToDeviceIsDifferentiable) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, -2, 3, 0.5}, {2, 2});
  x.set_requires_grad(true);
  Tensor y = x.to(kCuda);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "to_device");
  Tensor z = y.to(Device::cpu());
  Tensor loss = sum(mul(z, z));
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().device().is_cpu());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, -4, 6, 1}));
}

TEST_F(DeviceTensor, HostAccessorsRefuseDeviceTensors) {
  Tensor d = Tensor::zeros({4}, DType::f32, kCuda);
  expect_throws_with([&] { (void)d.data<float>(); }, {"data<f32>()", "cuda:0"});
  expect_throws_with([&] { (void)d.raw_data(); }, {"raw_data()", "cuda:0"});
  EXPECT_NE(d.device_data<float>(), nullptr);
}

TEST_F(DeviceTensor, OpsWithoutACudaKernelNameTheOpAndTheDevice) {
  Tensor d = Tensor::ones({2, 2}, DType::f32, kCuda);
  // Ops whose kernel tables are empty (emptied here; register_backend() fills them again).
  ops::matmul_device.set(DeviceKind::kCUDA, nullptr);
  expect_throws_with([&] { ops::matmul(d, d); }, {"matmul", "no kernel for cuda:0", "register_backend"});
  ops::exp_device.set(DeviceKind::kCUDA, nullptr);
  ops::sum_device.set(DeviceKind::kCUDA, nullptr);
  expect_throws_with([&] { ops::exp(d); }, {"exp", "cuda:0"});
  expect_throws_with([&] { ops::sum(d); }, {"sum", "cuda:0"});
  cuda::register_backend();
  Tensor h = Tensor::ones({2, 2});
  expect_throws_with([&] { ops::add(h, d); }, {"add", "cpu", "cuda:0"});
}

TEST_F(DeviceTensor, WithoutABackendAllocationNamesTheDevice) {
  register_device_backend(DeviceKind::kCUDA, nullptr);
  expect_throws_with([] { Tensor::zeros({2}, DType::f32, kCuda); },
                     {"cannot allocate on cuda:0", "no CUDA backend (link minidl_cuda_backend)"});
  cuda::register_backend();
  EXPECT_EQ(Tensor::zeros({2}, DType::f32, kCuda).device(), kCuda);
}

}  // namespace
}  // namespace minidl
