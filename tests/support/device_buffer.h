// A cudaMalloc'd array of n T for kernel tests, filled from and read back into host vectors. Under the CUDA emulator
// cudaMalloc/cudaMemcpy work on host memory; with nvcc they are the real runtime's.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "cuda_emu/cuda_compat.h"

namespace minidl::testing {

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

}  // namespace minidl::testing
