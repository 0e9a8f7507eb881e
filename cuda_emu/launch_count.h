// The number of kernels launched through launch_kernel (cuda_compat.h) since the program started or the CUDA
// backend's last reset_counters() (core/cuda/cuda.h). A header of its own, free of CUDA, so host code built by the
// host compiler against the real runtime can read the count that nvcc-built launchers add to.
#pragma once

#include <atomic>
#include <cstdint>

// An inline function's static is one object across every library that includes this header (the nvcc-built
// kernels, the emulated ones, the backend's host code), so there is one count.
inline std::atomic<int64_t>& minidl_kernel_launches() {
  static std::atomic<int64_t> launches{0};
  return launches;
}
