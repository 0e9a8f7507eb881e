// The whole CUDA backend at once: core's device backend (core/cuda/cuda.h), every op's CUDA kernels
// (ops/cuda/tensor/register.h) and dist's CUDA code (the "nccl" process group, the ring's NCCL transport, dist's
// device kernels). It lives here, in the highest layer with CUDA code, because it calls into all of them.
//
//   minidl::cuda::register_backend();   // once, at program start (train::select_device does it)
//   Tensor x = Tensor::randn({B, T, C}, Philox(/*seed=*/1), DType::f32, Device::cuda(0));
//
// Core's backend and the ops' kernels also register themselves when the backend library is linked (it is linked
// whole, core/cuda/CMakeLists.txt); register_backend() is idempotent and also restores what a test removed.
#pragma once

namespace minidl::cuda {

void register_backend();

// dist/cuda/register.cpp (register_without_nccl.cpp in a CUDA build without NCCL): the "nccl" backend, the ring's
// NCCL transport and dist's device kernels.
void register_dist();

}  // namespace minidl::cuda
