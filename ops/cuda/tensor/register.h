// The ops' CUDA entries on Tensors (one file per op family in ops/cuda/tensor/), built into the CUDA backend
// libraries: each file validates nothing (the op's entry in ops/ did), allocates outputs and scratch on the
// device through the caching allocator, and calls the launchers of ops/cuda/kernels.h on the device's compute
// stream. Each file has one register_* function that fills its ops' DeviceKernel tables; register_ops()
// (core/cuda/cuda.h) calls them all.
#pragma once

#include "core/cuda/cuda.h"
#include "core/tensor.h"

namespace minidl::ops::cuda {

void register_layernorm();
void register_nn();
void register_matmul();
void register_elementwise();
void register_reduce();
void register_softmax();
void register_gelu();
void register_conv();  // conv2d, max_pool2d: cuDNN (conv_cudnn.cpp), or the CPU kernels when emulated
void register_device_step();  // ops/cuda/tensor/device_step.cpp: clip, loss scale and AdamW without round trips

// Most kernels compute in f32 only (f64 stays a CPU dtype for gradient checks): other dtypes get an error naming
// the op, the argument, the dtype and the device.
inline void check_f32(const char* op, const char* name, const Tensor& t) {
  MINIDL_CHECK(t.dtype() == DType::f32, op, ": the CUDA kernel takes f32 ", name, ", got ", t.dtype(), " on ",
               t.device());
}

// The device's compute stream, with the device made current for the calling thread in the guard's scope.
struct OnDevice {
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(minidl::cuda::current_stream(t.device().index)) {}
  minidl::cuda::DeviceGuard guard;
  cudaStream_t stream;
};

}  // namespace minidl::ops::cuda
