#include "ops/elementwise.h"

#include <cmath>

#include "ops/cast.h"
#include "ops/strided_loop.h"

namespace minidl::ops {

using detail::strided_loop;

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  int n = std::max(a.size(), b.size());
  Shape out;
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.size()), ib = i - (n - b.size());  // aligned from the back; < 0: missing
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    MINIDL_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast");
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  MINIDL_ASSERT(t.dim() <= shape.size(), "cannot view ", t.shape(), " as ", shape);
  Strides st;
  int lead = shape.size() - t.dim();
  for (int i = 0; i < shape.size(); ++i) {
    int j = i - lead;
    bool stretched = j < 0 || (t.size(j) == 1 && shape[i] != 1);
    MINIDL_ASSERT(stretched || t.size(j) == shape[i], "cannot view ", t.shape(), " as ", shape);
    st.push_back(stretched ? 0 : t.stride(j));
  }
  return st;
}

namespace {

// Any device: the entries then run the CPU loops below or hand device tensors to their DeviceKernel table.
Shape check_binary(const char* op, const Tensor& a, const Tensor& b) {
  MINIDL_CHECK(a.defined() && b.defined(), op, ": undefined input");
  MINIDL_CHECK(a.device() == b.device(), op, ": inputs are on ", a.device(), " and ", b.device());
  MINIDL_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", a.dtype(), " and ", b.dtype(), " differ");
  return broadcast_shapes(op, a.shape(), b.shape());
}

// out = f(a, b) elementwise, over out's (broadcast) shape; out is contiguous, so its run stride is 1. The common
// run layouts (both contiguous, one side a broadcast scalar) get their own loops so the compiler vectorises them.
template <class T, class F>
void binary_into(Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const Shape& shape = out.shape();
  strided_loop<T, 3>(shape, {out.data<T>(), a.data<T>(), b.data<T>()},
                     {out.strides(), broadcast_strides(a, shape), broadcast_strides(b, shape)}, /*parallel=*/true,
                     [f](const std::array<T*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                       // No __restrict: add_ passes dst as both output and first input.
                       T* o = p[0];
                       const T* x = p[1];
                       const T* y = p[2];
                       if (s[1] == 1 && s[2] == 1) {
                         for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
                       } else if (s[1] == 1 && s[2] == 0) {
                         const T yv = *y;
                         for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
                       } else if (s[1] == 0 && s[2] == 1) {
                         const T xv = *x;
                         for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
                       } else {
                         for (int64_t i = 0; i < n; ++i) o[i] = f(x[i * s[1]], y[i * s[2]]);
                       }
                     });
}

template <class Op>
Tensor binary(const char* name, const Tensor& a, const Tensor& b,
              const DeviceKernel<Tensor(const Tensor&, const Tensor&)>& device, Op op) {
  Shape shape = check_binary(name, a, b);
  if (!a.device().is_cpu()) return device(a.device())(a, b);
  if (is_half(a.dtype())) return cast(binary(name, upcast(a), upcast(b), device, op), a.dtype());
  return dispatch_float(name, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    binary_into<T>(out, a, b, [op](T x, T y) { return op(x, y); });
    return out;
  });
}

// A unary entry's device path: its table's kernel, or an error naming the op and the device.
template <class Kernel>
Tensor on_device(const Kernel& device, const Tensor& a) {
  return device(a.device())(a);
}

// out = f(a), out contiguous with a's shape; a may have any strides.
// `device_path()` runs the op on a device tensor (through its DeviceKernel table).
template <class DevicePath, class Op>
Tensor unary(const char* name, const Tensor& a, DevicePath device_path, Op op) {
  MINIDL_CHECK(a.defined(), name, ": undefined input");
  if (!a.device().is_cpu()) return device_path();
  if (is_half(a.dtype())) return cast(unary(name, upcast(a), device_path, op), a.dtype());
  return dispatch_float(name, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
    strided_loop<T, 2>(a.shape(), {out.data<T>(), a.data<T>()}, {out.strides(), a.strides()}, /*parallel=*/true,
                       [op](const std::array<T*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                         T* __restrict o = p[0];
                         const T* __restrict x = p[1];
                         if (s[1] == 1) {
                           for (int64_t i = 0; i < n; ++i) o[i] = T(op(x[i]));
                         } else {
                           for (int64_t i = 0; i < n; ++i) o[i] = T(op(x[i * s[1]]));
                         }
                       });
    return out;
  });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", a, b, add_device, [](auto x, auto y) { return x + y; });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", a, b, sub_device, [](auto x, auto y) { return x - y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", a, b, mul_device, [](auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary("div", a, b, div_device, [](auto x, auto y) { return x / y; });
}

// The scalar is converted to the tensor's type once, so f32 math stays in f32.
Tensor add(const Tensor& a, double s) {
  return unary(
      "add", a, [&] { return add_scalar_device(a.device())(a, s); }, [s](auto x) { return x + decltype(x)(s); });
}
Tensor mul(const Tensor& a, double s) {
  return unary(
      "mul", a, [&] { return mul_scalar_device(a.device())(a, s); }, [s](auto x) { return x * decltype(x)(s); });
}

Tensor neg(const Tensor& a) {
  return unary(
      "neg", a, [&] { return on_device(neg_device, a); }, [](auto x) { return -x; });
}
Tensor exp(const Tensor& a) {
  return unary(
      "exp", a, [&] { return on_device(exp_device, a); }, [](auto x) { return std::exp(x); });
}
Tensor log(const Tensor& a) {
  return unary(
      "log", a, [&] { return on_device(log_device, a); }, [](auto x) { return std::log(x); });
}
Tensor tanh(const Tensor& a) {
  return unary(
      "tanh", a, [&] { return on_device(tanh_device, a); }, [](auto x) { return std::tanh(x); });
}
Tensor sqrt(const Tensor& a) {
  return unary(
      "sqrt", a, [&] { return on_device(sqrt_device, a); }, [](auto x) { return std::sqrt(x); });
}
Tensor square(const Tensor& a) {
  return unary(
      "square", a, [&] { return on_device(square_device, a); }, [](auto x) { return x * x; });
}

Tensor tanh_backward(const Tensor& grad, const Tensor& y) {
  MINIDL_CHECK(grad.shape() == y.shape(), "tanh_backward: gradient shape ", grad.shape(), " differs from output shape ",
               y.shape());
  return binary("tanh_backward", grad, y, tanh_backward_device,
                [](auto g, auto t) { return g * (decltype(g)(1) - t * t); });
}

void add_(Tensor& dst, const Tensor& src) {
  MINIDL_CHECK(dst.shape() == src.shape(), "add_: shapes ", dst.shape(), " and ", src.shape(), " differ");
  MINIDL_CHECK(dst.is_contiguous(), "add_: destination of shape ", dst.shape(), " must be contiguous");
  // A gradient in another precision (e.g. f16 into an f32 master gradient) is converted first (on a device, by
  // the device kernel).
  if (!dst.device().is_cpu() && src.defined() && src.device() == dst.device())
    return add_inplace_device(dst.device())(dst, src);
  Tensor s = src.dtype() == dst.dtype() ? src : src.detach().to(dst.dtype());
  check_binary("add_", dst, s);
  dispatch_float("add_", dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    binary_into<T>(dst, dst, s, [](T x, T y) { return x + y; });
  });
}

Tensor broadcast_to(const Tensor& t, const Shape& shape) {
  MINIDL_CHECK(broadcast_shapes("broadcast_to", t.shape(), shape) == shape, "broadcast_to: shape ", t.shape(),
               " cannot be broadcast to ", shape);
  if (!t.device().is_cpu()) return broadcast_to_device(t.device())(t, shape);
  if (is_half(t.dtype())) return cast(broadcast_to(upcast(t), shape), t.dtype());
  return dispatch_float("broadcast_to", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    strided_loop<T, 2>(shape, {out.data<T>(), t.data<T>()}, {out.strides(), broadcast_strides(t, shape)},
                       /*parallel=*/true, [](const std::array<T*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                         if (s[1] == 0) {
                           std::fill(p[0], p[0] + n, *p[1]);
                         } else {
                           for (int64_t i = 0; i < n; ++i) p[0][i] = p[1][i * s[1]];
                         }
                       });
    return out;
  });
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  MINIDL_CHECK(broadcast_shapes("sum_to_shape", shape, grad.shape()) == grad.shape(), "sum_to_shape: shape ", shape,
               " does not broadcast to the gradient's shape ", grad.shape());
  if (!grad.device().is_cpu()) return sum_to_shape_device(grad.device())(grad, shape);
  if (is_half(grad.dtype())) return cast(sum_to_shape(upcast(grad), shape), grad.dtype());
  return dispatch_float("sum_to_shape", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::zeros(shape, grad.dtype(), grad.device());
    // The output has stride 0 on the summed dimensions, so several runs add into the same elements: serial.
    strided_loop<T, 2>(grad.shape(), {out.data<T>(), grad.data<T>()},
                       {broadcast_strides(out, grad.shape()), grad.strides()}, /*parallel=*/false,
                       [](const std::array<T*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                         T* __restrict o = p[0];
                         const T* __restrict g = p[1];
                         if (s[0] == 0) {
                           T acc = 0;
                           for (int64_t i = 0; i < n; ++i) acc += g[i * s[1]];
                           *o += acc;
                         } else if (s[0] == 1 && s[1] == 1) {
                           for (int64_t i = 0; i < n; ++i) o[i] += g[i];
                         } else {
                           for (int64_t i = 0; i < n; ++i) o[i * s[0]] += g[i * s[1]];
                         }
                       });
    return out;
  });
}

}  // namespace minidl::ops
