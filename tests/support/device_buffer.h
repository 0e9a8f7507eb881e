// A cudaMalloc'd array of n T for kernel tests, filled from and read back into host vectors. Under the CUDA emulator
// cudaMalloc/cudaMemcpy work on host memory; with nvcc they are the real runtime's.
//
// A buffer made from a size alone is poisoned: every byte 0xFF (NaN in f32, f16 and bf16; -1 in the integers), so an
// output element that a kernel leaves unwritten fails the comparison instead of passing with whatever cudaMalloc
// returned. A kernel that accumulates into its output takes DeviceBuffer<T>::zeros(n).
//
// On a GPU, MINIDL_TEST_NO_POISON=1 leaves new buffers as cudaMalloc returned them: compute-sanitizer's initcheck
// (scripts/gpu-run.sh) then sees a kernel read memory nothing wrote, which the fill would count as written.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda_emu/cuda_compat.h"

namespace minidl::testing {

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, (n ? n : 1) * sizeof(T)), cudaSuccess);
#if defined(MINIDL_CUDA_EMULATED) && !defined(MINIDL_TEST_GPU)
    // The emulator's initcheck poisons new memory itself and reports a kernel reading it (cuda_emu/check.h);
    // a memset here would count as a write and hide that.
    if (minidl::emu::options().checks & minidl::emu::kInitcheck) return;
#endif
#ifdef MINIDL_TEST_GPU
    if (const char* no_poison = std::getenv("MINIDL_TEST_NO_POISON"); no_poison && std::strcmp(no_poison, "1") == 0)
      return;
#endif
    EXPECT_EQ(cudaMemset(ptr_, 0xFF, (n ? n : 1) * sizeof(T)), cudaSuccess);
  }
  static DeviceBuffer zeros(size_t n) {
    DeviceBuffer b(n);
    EXPECT_EQ(cudaMemset(b.ptr_, 0, (n ? n : 1) * sizeof(T)), cudaSuccess);
    return b;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)), n_(other.n_) {}
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
