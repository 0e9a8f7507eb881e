// Helpers for the CUDA kernel tests: device buffers (tests/support/device_buffer.h) and the float contents of CPU
// tensors. The kernels run on the CPU emulator of CUDA here (minidl_cuda_kernels_emu), whose
// cudaMalloc/cudaMemcpy work on host memory.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "core/tensor.h"
#include "cuda_emu/cuda_compat.h"
#include "tests/support/device_buffer.h"

namespace minidl::testing {

// A contiguous f32 tensor's elements.
inline std::vector<float> floats(const Tensor& t) {
  const float* p = t.contiguous().data<float>();
  return std::vector<float>(p, p + t.numel());
}

// Widened to double, for expect_close (nn_test_util.h).
inline std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace minidl::testing
