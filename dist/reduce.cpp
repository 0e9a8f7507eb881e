#include "dist/reduce.h"

#include "core/error.h"
#include "core/half.h"

namespace minidl::dist {

namespace {

template <class T>
void sum_into(T* __restrict dst, const T* __restrict src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = T(dst[i] + src[i]);
}

// Written as a select (not std::max) so it vectorises; it keeps dst on ties and when src is NaN, as MPI_MAX does.
template <class T>
void max_into(T* __restrict dst, const T* __restrict src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = src[i] > dst[i] ? src[i] : dst[i];
}

template <class T>
void divide(T* data, int64_t count, int divisor) {
  const T d = T(divisor);
  for (int64_t i = 0; i < count; ++i) data[i] = T(data[i] / d);
}

// 16-bit floats (ProcessGroup::all_reduce_16bit's): each element through f32, rounded back once, so every hop of a
// ring rounds its partial sum to the dtype, as NCCL's native reduction does.
f16 rounded(f16, float f) { return to_f16(f); }
bf16 rounded(bf16, float f) { return to_bf16(f); }
template <class H>
void sum_into_16bit(H* __restrict dst, const H* __restrict src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = rounded(H{}, to_float(dst[i]) + to_float(src[i]));
}

// Calls fn(T{}) for the dtypes the reduction kernels are written for (the 16-bit ones have their own).
template <class Fn>
void dispatch_reducible(const char* what, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::u8: return fn(uint8_t{});
    case DType::f16:
    case DType::bf16: break;
  }
  MINIDL_ASSERT(false, what, ": ", dtype, " has no reduction here");
}

}  // namespace

void reduce_into(DType dtype, ReduceOp op, void* dst, const void* src, int64_t count) {
  if (dtype == DType::f16 || dtype == DType::bf16) {
    MINIDL_ASSERT(op != ReduceOp::kMax, "reduce_into: 16-bit reductions are sums");
    if (dtype == DType::f16) return sum_into_16bit(static_cast<f16*>(dst), static_cast<const f16*>(src), count);
    return sum_into_16bit(static_cast<bf16*>(dst), static_cast<const bf16*>(src), count);
  }
  dispatch_reducible("reduce_into", dtype, [&](auto tag) {
    using T = decltype(tag);
    if (op == ReduceOp::kMax)
      max_into(static_cast<T*>(dst), static_cast<const T*>(src), count);
    else
      sum_into(static_cast<T*>(dst), static_cast<const T*>(src), count);
  });
}

void divide_by(DType dtype, void* data, int64_t count, int divisor) {
  if (divisor == 1) return;
  dispatch_reducible("divide_by", dtype, [&](auto tag) {
    using T = decltype(tag);
    divide(static_cast<T*>(data), count, divisor);
  });
}

void reduce_into(Tensor& dst, const Tensor& src, ReduceOp op) {
  MINIDL_ASSERT(dst.dtype() == src.dtype() && dst.numel() == src.numel() && dst.device() == src.device());
  if (!dst.device().is_cpu()) return reduce_into_device(dst.device())(dst, src, op);
  reduce_into(dst.dtype(), op, dst.raw_data(), src.raw_data(), dst.numel());
}

void divide_by(Tensor& data, int divisor) {
  if (divisor == 1) return;
  if (!data.device().is_cpu()) return divide_by_device(data.device())(data, divisor);
  divide_by(data.dtype(), data.raw_data(), data.numel(), divisor);
}

void convert_into(Tensor& dst, const Tensor& src) {
  MINIDL_ASSERT(dst.numel() == src.numel() && dst.device() == src.device());
  if (!dst.device().is_cpu() && dst.dtype() != src.dtype()) return convert_into_device(dst.device())(dst, src);
  dst.copy_(src.as_strided(dst.shape(), dst.strides(), 0));
}

}  // namespace minidl::dist
