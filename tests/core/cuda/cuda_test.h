// The fixture of core's device tests. The same sources build twice: against the emulator
// (test_core_cuda, MINIDL_TEST_EMULATED_CUDA), where they always run, and against the real runtime
// (test_core_cuda_gpu), where they skip on a machine without a CUDA device.
#pragma once

#include <gtest/gtest.h>

#include "core/cuda/cuda.h"
#include "dist/cuda/backend.h"

namespace minidl::testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(MINIDL_TEST_EMULATED_CUDA)
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
#endif
    cuda::register_backend();
  }
};

}  // namespace minidl::testing
