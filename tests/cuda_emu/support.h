// Helpers for the emulator tests: device buffers, option overrides, and the source lines of planted bugs.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "cuda_emu/cuda_compat.h"
#include "tests/support/device_buffer.h"

namespace emu_test {

using minidl::testing::DeviceBuffer;

// Sets emulator options for one scope, restoring the previous ones (those from the environment) after.
class ScopedOptions {
 public:
  explicit ScopedOptions(minidl::emu::Options o) : saved_(minidl::emu::options()) { minidl::emu::set_options(o); }
  ~ScopedOptions() { minidl::emu::set_options(saved_); }

  static minidl::emu::Options with_order(minidl::emu::Order order) {
    minidl::emu::Options o = minidl::emu::options();
    o.order = order;
    return o;
  }
  // For the tests of what a bug does when no checker stops it (a poisoned read, a missing barrier).
  static minidl::emu::Options without_checks(unsigned checks = minidl::emu::kAllChecks) {
    minidl::emu::Options o = minidl::emu::options();
    o.checks &= ~checks;
    return o;
  }

 private:
  minidl::emu::Options saved_;
};

// x[i] = a * x[i] + b: a kernel whose result tells whether it ran, and how often (graph and stream tests).
inline __global__ void affine_kernel(float* x, float a, float b, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = a * x[i] + b;
}

// 1-based line of kernels.cu holding `marker` ("planted:divergent-low"), so reports can be matched exactly.
inline int planted_line(const std::string& marker) {
  std::ifstream in(MINIDL_EMU_KERNELS_CU);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number)
    if (line.find("// " + marker) != std::string::npos) return number;
  ADD_FAILURE() << "marker '" << marker << "' not found in " << MINIDL_EMU_KERNELS_CU;
  return -1;
}

}  // namespace emu_test
