// The fixture of the tensor-level CUDA op tests (test_cuda_tensor_ops): the ops of ops/*.h called on device
// tensors, which the emulated backend (minidl_cuda_backend_emu) runs with ops/cuda's kernels, compared with the
// same op on the CPU copies.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/cuda/cuda.h"
#include "ops/cuda/tensor/register.h"
#include "nn_test_util.h"

namespace minidl::testing {

inline const Device kCuda = Device::cuda(0);

class CudaTensorOps : public ::testing::Test {
 protected:
  void SetUp() override { ops::cuda::register_kernels(); }
};

// got: the device result; want: the CPU op's result. Same shape and dtype, got on the device, values within
// rtol of want's largest magnitude (expect_close).
inline void expect_device_matches(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.device(), kCuda) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  expect_close(got.to(Device::cpu()).to_vector(), want.to_vector(), rtol, what);
}

// Default tolerances by dtype: f32 ~1e-5, f16 and bf16 one rounding of the 16-bit result (~2e-3, ~1e-2).
inline double rtol_for(DType dt) { return dt == DType::f16 ? 2e-3 : dt == DType::bf16 ? 1e-2 : 1e-5; }

inline std::string shape_name(const Shape& s) {
  std::string name;
  for (int i = 0; i < s.size(); ++i) {
    if (i > 0) name += 'x';
    name += std::to_string(s[i]);
  }
  return name.empty() ? "scalar" : name;
}

// The counters of what `fn` asked of the device.
template <class Fn>
cuda::Counters counted(Fn&& fn) {
  const cuda::Counters before = cuda::counters();
  fn();
  return cuda::counters() - before;
}

}  // namespace minidl::testing
