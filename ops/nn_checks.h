// Argument checks shared by the neural-network ops (embedding, layernorm, gelu, softmax, cross-entropy,
// attention, dropout). Each names the op and the argument, and says what was expected and what was given.
// Kernels assume these passed: contiguous, matching float dtypes and devices. The checks accept any device: each
// op's entry then runs its CPU code or hands device tensors to its DeviceKernel table (ops/device_kernel.h), which
// names the op and the device when this build has no kernel for it.
#pragma once

#include "core/tensor.h"

namespace minidl::ops {

inline void check_defined(const char* op, const char* name, const Tensor& t) {
  MINIDL_CHECK(t.defined(), op, ": ", name, " is undefined");
}

inline void check_contiguous(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  MINIDL_CHECK(t.is_contiguous(), op, ": expected ", name, " to be contiguous, got shape ", t.shape(), " with strides ",
               t.strides());
}

// A contiguous f32 or f64 tensor.
inline void check_float(const char* op, const char* name, const Tensor& t) {
  check_contiguous(op, name, t);
  MINIDL_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, ": expected ", name, " to be f32 or f64, got ",
               t.dtype());
}

// A contiguous f32, f64, f16 or bf16 tensor: the ops that take 16-bit storage (ops/cast.h) compute in f32.
inline void check_float_or_half(const char* op, const char* name, const Tensor& t) {
  check_contiguous(op, name, t);
  MINIDL_CHECK(is_floating(t.dtype()), op, ": expected ", name, " to be f32 or f64 (or f16/bf16 storage), got ",
               t.dtype());
}

// A contiguous float tensor with the same dtype and device as `ref`.
inline void check_like(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  check_float_or_half(op, name, t);
  MINIDL_CHECK(t.dtype() == ref.dtype(), op, ": expected ", name, " to have dtype ", ref.dtype(), ", got ", t.dtype());
  MINIDL_CHECK(t.device() == ref.device(), op, ": expected ", name, " on ", ref.device(), ", got ", t.device());
}

// A contiguous float tensor of exactly `shape`, dtype and device as `ref`.
inline void check_shaped_like(const char* op, const char* name, const Tensor& t, const Shape& shape,
                              const Tensor& ref) {
  check_like(op, name, t, ref);
  MINIDL_CHECK(t.shape() == shape, op, ": expected ", name, " of shape ", shape, ", got ", t.shape());
}

// A contiguous i32 or i64 tensor.
inline void check_index(const char* op, const char* name, const Tensor& t) {
  check_contiguous(op, name, t);
  MINIDL_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, op, ": expected ", name, " to be i32 or i64, got ",
               t.dtype());
}

// Calls fn with a value of the index type of t (int32_t or int64_t); t passed check_index.
template <class Fn>
decltype(auto) dispatch_index(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::i32) return fn(int32_t{});
  return fn(int64_t{});
}

}  // namespace minidl::ops
