// Where a test binary built from one source three times runs its models: the CPU (no definition), the emulated CUDA
// device (MINIDL_TEST_EMULATED_CUDA) or a real GPU (MINIDL_TEST_GPU, where a test skips on a machine without one).
//
//   #include "tests/support/test_device.h"
//   TEST(Suite, Case) {
//     SKIP_WITHOUT_DEVICE();
//     nn::GPT model(config, seed);
//     model.to(minidl::testing::test_device());
//   }
//
// Defines MINIDL_TEST_CUDA when the binary runs on a CUDA device (emulated or real).
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"

#if defined(MINIDL_TEST_EMULATED_CUDA) || defined(MINIDL_TEST_GPU)
#define MINIDL_TEST_CUDA 1
#include "core/cuda/cuda.h"
#include "dist/cuda/backend.h"
#endif

namespace minidl::testing {

// The device this binary's models run on (registering the CUDA backend first when it is one).
inline Device test_device() {
#if defined(MINIDL_TEST_CUDA)
  cuda::register_backend();
  return Device::cuda(0);
#else
  return Device::cpu();
#endif
}

// True when the binary is built for a CUDA device and the machine has none (only a real runtime can find none).
inline bool no_device() {
#if defined(MINIDL_TEST_CUDA)
  return cuda::device_count() == 0;
#else
  return false;
#endif
}

}  // namespace minidl::testing

// Skips the current test when no_device(); one statement.
#define SKIP_WITHOUT_DEVICE()                                             \
  do {                                                                    \
    if (::minidl::testing::no_device()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
