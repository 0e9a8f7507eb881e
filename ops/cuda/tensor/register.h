// The ops' CUDA entries on Tensors (ops/cuda/tensor/, one file per op or op family), built into the CUDA backend
// libraries: each file validates nothing (the op's entry in ops/ did), allocates outputs and scratch on the device
// through the caching allocator, and calls the launchers of ops/cuda/<kernel>.h on the device's compute stream.
// Each file fills its own ops' DeviceKernel tables (ops/device_kernel.h) and registers itself; no list names it:
//
//   namespace {
//   void register_softmax() { softmax_forward_device.set(DeviceKind::kCUDA, &forward); ... }
//   }  // namespace
//   MINIDL_REGISTER_CUDA_KERNELS(register_softmax);
//
// The registrar runs at static initialisation, so a program that links the backend (core/cuda/CMakeLists.txt links
// it whole, --whole-archive, so that no self-registering object is dropped) has every table filled before main();
// register_kernels() runs every registrar again (to refill tables a test emptied).
#pragma once

// Registers `fn`, a void() of this file that fills DeviceKernel tables (see above). At namespace scope.
#define MINIDL_REGISTER_CUDA_KERNELS(fn)                                   \
  [[maybe_unused]] static const bool minidl_cuda_kernels_registered_##fn = \
      ::minidl::ops::cuda::detail::add_registrar(&fn)

#include "core/cuda/cuda.h"
#include "core/tensor.h"
#include "ops/cast.h"

namespace minidl::ops::cuda {

// Runs every registrar of the linked entries again (idempotent).
void register_kernels();

namespace detail {
// Records `registrar` and runs it; returns true (it initialises MINIDL_REGISTER_CUDA_KERNELS's flag).
bool add_registrar(void (*registrar)());
}  // namespace detail

// Most kernels compute in f32 only (f64 stays a CPU dtype for gradient checks): other dtypes get an error naming
// the op, the argument, the dtype and the device.
inline void check_f32(const char* op, const char* name, const Tensor& t) {
  MINIDL_CHECK(t.dtype() == DType::f32, op, ": the CUDA kernel takes f32 ", name, ", got ", t.dtype(), " on ",
               t.device());
}

// A host copy of device ids or targets, as i64 (validated there: the kernels index with them unchecked).
inline Tensor host_i64(const Tensor& t) { return cast(t.to(Device::cpu()).detach(), DType::i64); }

// The device's compute stream, with the device made current for the calling thread in the guard's scope.
struct OnDevice {
  explicit OnDevice(const Tensor& t)
      : guard(t.device().index), stream(minidl::cuda::current_stream(t.device().index)) {}
  minidl::cuda::DeviceGuard guard;
  cudaStream_t stream;
};

}  // namespace minidl::ops::cuda
