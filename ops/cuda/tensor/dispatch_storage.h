// The storage type of a float device tensor as a C++ type, for the entries whose kernels are templated on it
// (layernorm, bias_gelu): f32 -> float, f16 -> __half, bf16 -> __nv_bfloat16. Internal to the CUDA backend.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/tensor/elementwise.h"

namespace minidl::ops::cuda {

// Calls fn with a value of t's storage type; other dtypes (f64, integers) get check_cuda_dtype's error.
template <class Fn>
void dispatch_float_storage(const char* op, const Tensor& t, Fn&& fn) {
  check_cuda_dtype(op, t, /*half_too=*/true);
  if (t.dtype() == DType::f32)
    fn(float{});
  else if (t.dtype() == DType::f16)
    fn(__half{});
  else
    fn(__nv_bfloat16{});
}

template <class T>
T* storage_ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_device_data());
}

}  // namespace minidl::ops::cuda
