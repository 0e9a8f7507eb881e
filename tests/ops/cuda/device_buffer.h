// Helpers for the CUDA kernel tests: device buffers filled from and read back into host vectors, and the float
// contents of CPU tensors. The kernels run on the CPU emulator of CUDA here (minidl_cuda_kernels_emu), whose
// cudaMalloc/cudaMemcpy work on host memory.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "core/tensor.h"
#include "cuda_emu/cuda_compat.h"

namespace minidl::testing {

// A cudaMalloc'd array of n T.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&ptr_, (n ? n : 1) * sizeof(T)), cudaSuccess); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// A contiguous f32 tensor's elements.
inline std::vector<float> floats(const Tensor& t) {
  const float* p = t.contiguous().data<float>();
  return std::vector<float>(p, p + t.numel());
}

// Widened to double, for expect_close (nn_test_util.h).
inline std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace minidl::testing
