// The per-op table of device kernels. The minidl library computes on the CPU only and never links a device
// runtime; an op that also runs on CUDA declares one DeviceKernel per entry point in its header, and the CUDA
// backend library (minidl_cuda_backend, or its emulated twin minidl_cuda_backend_emu) fills it when
// minidl::cuda::register_backend() runs. The op's entry validates its arguments once, then hands device
// tensors to the table:
//
//   // ops/layernorm.h
//   inline DeviceKernel<LayerNormForward(const Tensor&, const Tensor&, const Tensor&, double)>
//       layernorm_forward_device{"layernorm"};
//
//   // ops/cpu/layernorm.cpp, after the checks
//   if (!x.device().is_cpu()) return layernorm_forward_device(x.device())(x, weight, bias, eps);
//
//   // ops/cuda/tensor/layernorm.cpp (in the backend library)
//   ops::layernorm_forward_device.set(DeviceKind::kCUDA, &layernorm_forward);
//
// Without a registered kernel the call throws, naming the op and the device:
//   "layernorm: no kernel for cuda:0 in this build (link minidl_cuda_backend and call
//    minidl::cuda::register_backend(), or move the tensors with to(Device::cpu()))"
#pragma once

#include "core/device.h"
#include "core/error.h"

namespace minidl::ops {

template <class Signature>
class DeviceKernel;

template <class R, class... Args>
class DeviceKernel<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  explicit constexpr DeviceKernel(const char* op) : op_(op) {}

  // Installs (or, with nullptr, removes) the kernel of a device kind. kCPU is the op's own code, never a table
  // entry.
  void set(DeviceKind kind, Fn fn) {
    MINIDL_CHECK(kind != DeviceKind::kCPU, op_, ": the CPU kernel is the op itself, not a table entry");
    cuda_ = fn;
  }

  bool has(Device device) const { return device.is_cuda() && cuda_ != nullptr; }

  // The kernel for `device` (not the CPU); throws naming the op and the device when none is registered.
  Fn operator()(Device device) const {
    MINIDL_CHECK(has(device), op_, ": no kernel for ", device,
                 " in this build (link minidl_cuda_backend and call minidl::cuda::register_backend(), or move the "
                 "tensors with to(Device::cpu()))");
    return cuda_;
  }

  const char* op() const { return op_; }

 private:
  const char* op_;
  Fn cuda_ = nullptr;
};

}  // namespace minidl::ops
