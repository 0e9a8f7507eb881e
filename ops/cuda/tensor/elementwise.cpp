// ops/elementwise.h on CUDA devices: ops/cuda/elementwise.cu (and reduce.cu for sum_to_shape) through
// ops/cuda/elementwise.h. f32, f16 and bf16 storage, computed in f32 like the CPU ops; f64 stays a CPU dtype (gradient
// checks). Inputs may be any views: the kernels read them through their strides, so nothing is copied first.
#include "ops/cuda/tensor/elementwise.h"

#include <vector>

#include "ops/cuda/cast.h"
#include "ops/cuda/reduce.h"
#include "ops/cuda/tensor/register.h"
#include "ops/elementwise.h"

namespace minidl::ops::cuda {

static_assert(Shape::kMaxDims <= kMaxElementwiseDims, "an elementwise layout must hold any Shape");

namespace {

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_device_data());
}

// Calls fn with a value of t's storage type (float, __half or __nv_bfloat16).
template <class Fn>
void dispatch_storage(const char* op, const Tensor& t, Fn&& fn) {
  check_cuda_dtype(op, t, /*half_too=*/true);
  if (t.dtype() == DType::f32)
    fn(float{});
  else if (t.dtype() == DType::f16)
    fn(__half{});
  else
    fn(__nv_bfloat16{});
}

ElementwiseLayout layout_of(const Shape& shape, const Strides& s0, const Strides& s1) {
  ElementwiseLayout l;
  l.dims = shape.size();
  for (int d = 0; d < l.dims; ++d) {
    l.sizes[d] = shape[d];
    l.strides[0][d] = s0[d];
    l.strides[1][d] = s1.size() == shape.size() ? s1[d] : 0;
  }
  return l;
}

const char* name_of(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
    case BinaryOp::kTanhBackward: return "tanh_backward";
    case BinaryOp::kGeluBackward: return "gelu_backward";
  }
  return "elementwise";
}

template <BinaryOp kOp>
Tensor binary(const Tensor& a, const Tensor& b) {
  return binary_on_device(name_of(kOp), kOp, a, b);
}

const char* name_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "neg";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kTanh: return "tanh";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kSquare: return "square";
    default: return "elementwise";
  }
}

template <UnaryOp kOp>
Tensor unary(const Tensor& x) {
  return unary_on_device(name_of(kOp), kOp, x, x.shape());
}

// The scalar is rounded to f32 once, as the CPU op rounds it to the tensor's (computing) type.
Tensor add_scalar(const Tensor& x, double s) {
  return unary_on_device("add", UnaryOp::kAddScalar, x, x.shape(), float(s));
}
Tensor mul_scalar(const Tensor& x, double s) {
  return unary_on_device("mul", UnaryOp::kMulScalar, x, x.shape(), float(s));
}

// dst (f32) += src; a 16-bit src (a gradient computed under autocast) is converted to f32 on the device first.
void add_inplace(Tensor& dst, const Tensor& src) {
  check_cuda_dtype("add_", dst, /*half_too=*/false);
  check_cuda_dtype("add_", src, /*half_too=*/true);
  const Tensor s = src.dtype() == DType::f32 ? src : upcast_on_device(src);
  OnDevice on(dst);
  const ElementwiseLayout l = layout_of(dst.shape(), dst.strides(), s.strides());
  MINIDL_CUDA_CHECK(elementwise_binary(BinaryOp::kAdd, ptr<float>(dst), ptr<float>(s), ptr<float>(dst), l, on.stream));
}

Tensor broadcast_to(const Tensor& t, const Shape& shape) {
  return unary_on_device("broadcast_to", UnaryOp::kCopy, t, shape);
}

// Sums over the dimensions that `shape` (aligned to grad's trailing dimensions) has as 1 and grad does not. Grad
// (made contiguous) is cut into runs of neighbouring dimensions that are all summed or all kept; each pass sums the
// last summed run as the n of an (outer, n, inner) reduction, until only kept runs remain, the last pass writing
// the result. A bias gradient ((B, T, C) -> (C)) or a position-embedding one ((B, T, C) -> (T, C)) is one pass.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.dtype() != DType::f32) {
    check_cuda_dtype("sum_to_shape", grad, /*half_too=*/true);
    return downcast_on_device(sum_to_shape(upcast_on_device(grad), shape), grad.dtype());
  }
  Tensor out = Tensor::empty(shape, DType::f32, grad.device());
  if (out.numel() == 0) return out;
  if (grad.numel() == 0) return Tensor::zeros(shape, DType::f32, grad.device());
  struct Run {
    int64_t size;
    bool summed;
  };
  std::vector<Run> runs;
  const int lead = grad.dim() - shape.size();
  for (int d = 0; d < grad.dim(); ++d) {
    if (grad.size(d) == 1) continue;
    const bool summed = d < lead || shape[d - lead] == 1;
    if (!runs.empty() && runs.back().summed == summed)
      runs.back().size *= grad.size(d);
    else
      runs.push_back({grad.size(d), summed});
  }
  OnDevice on(grad);
  Tensor current = contiguous_on_device(grad);
  for (;;) {
    int r = int(runs.size()) - 1;
    while (r >= 0 && !runs[r].summed) --r;
    if (r < 0) break;
    int64_t outer = 1, inner = 1;
    bool last = true;
    for (int k = 0; k < r; ++k) outer *= runs[k].size, last = last && !runs[k].summed;
    for (int k = r + 1; k < int(runs.size()); ++k) inner *= runs[k].size;
    const int64_t n = runs[r].size;
    Tensor next = last ? out : Tensor::empty({outer * inner}, DType::f32, grad.device());
    Tensor scratch =
        Tensor::empty({int64_t(reduce_dim_scratch_floats(ReduceOp::kSum, outer, n, inner))}, DType::f32, grad.device());
    MINIDL_CUDA_CHECK(reduce_dim(ReduceOp::kSum, ptr<float>(current), outer, n, inner, 1.0f, ptr<float>(next), nullptr,
                                 ptr<float>(scratch), on.stream));
    current = next;
    runs.erase(runs.begin() + r);
    if (r > 0 && r < int(runs.size())) {  // two kept runs now meet
      runs[r - 1].size *= runs[r].size;
      runs.erase(runs.begin() + r);
    }
  }
  if (!current.same(out)) {  // nothing was summed (shape only drops or adds size-1 dimensions): copy
    ElementwiseLayout l;
    l.dims = 1;
    l.sizes[0] = out.numel();
    l.strides[0][0] = 1;
    MINIDL_CUDA_CHECK(elementwise_unary(UnaryOp::kCopy, ptr<float>(current), ptr<float>(out), l, 0.0f, on.stream));
  }
  return out;
}

}  // namespace

void check_cuda_dtype(const char* op, const Tensor& t, bool half_too) {
  const bool ok = t.dtype() == DType::f32 || (half_too && (t.dtype() == DType::f16 || t.dtype() == DType::bf16));
  MINIDL_CHECK(ok, op, ": the CUDA kernel takes ", half_too ? "f32, f16 or bf16" : "f32", ", got ", t.dtype(), " on ",
               t.device());
}

Tensor unary_on_device(const char* op_name, UnaryOp op, const Tensor& x, const Shape& shape, float scalar) {
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const ElementwiseLayout l = layout_of(shape, broadcast_strides(x, shape), {});
  OnDevice on(x);
  dispatch_storage(op_name, x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(elementwise_unary(op, ptr<const T>(x), ptr<T>(out), l, scalar, on.stream));
  });
  return out;
}

Tensor binary_on_device(const char* op_name, BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(op_name, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const ElementwiseLayout l = layout_of(shape, broadcast_strides(a, shape), broadcast_strides(b, shape));
  OnDevice on(a);
  dispatch_storage(op_name, a, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(elementwise_binary(op, ptr<const T>(a), ptr<const T>(b), ptr<T>(out), l, on.stream));
  });
  return out;
}

Tensor contiguous_on_device(const Tensor& t) {
  if (t.is_contiguous()) return t;
  const DType dt = t.dtype();
  if (dt != DType::f32 && dt != DType::f16 && dt != DType::bf16) return t.detach().contiguous();
  return unary_on_device("contiguous", UnaryOp::kCopy, t, t.shape());
}

Tensor upcast_on_device(const Tensor& t) {
  Tensor c = contiguous_on_device(t);
  Tensor out = Tensor::empty(t.shape(), DType::f32, t.device());
  OnDevice on(t);
  if (t.dtype() == DType::f16)
    MINIDL_CUDA_CHECK(cast_f16_to_f32(ptr<const __half>(c), ptr<float>(out), out.numel(), on.stream));
  else
    MINIDL_CUDA_CHECK(cast_bf16_to_f32(ptr<const __nv_bfloat16>(c), ptr<float>(out), out.numel(), on.stream));
  return out;
}

Tensor downcast_on_device(const Tensor& t32, DType dtype) {
  Tensor out = Tensor::empty(t32.shape(), dtype, t32.device());
  OnDevice on(t32);
  if (dtype == DType::f16)
    MINIDL_CUDA_CHECK(cast_f32_to_f16(ptr<const float>(t32), ptr<__half>(out), out.numel(), on.stream));
  else
    MINIDL_CUDA_CHECK(cast_f32_to_bf16(ptr<const float>(t32), ptr<__nv_bfloat16>(out), out.numel(), on.stream));
  return out;
}

namespace {

void register_elementwise() {
  add_device.set(DeviceKind::kCUDA, &binary<BinaryOp::kAdd>);
  sub_device.set(DeviceKind::kCUDA, &binary<BinaryOp::kSub>);
  mul_device.set(DeviceKind::kCUDA, &binary<BinaryOp::kMul>);
  div_device.set(DeviceKind::kCUDA, &binary<BinaryOp::kDiv>);
  tanh_backward_device.set(DeviceKind::kCUDA, &binary<BinaryOp::kTanhBackward>);
  add_scalar_device.set(DeviceKind::kCUDA, &add_scalar);
  mul_scalar_device.set(DeviceKind::kCUDA, &mul_scalar);
  neg_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kNeg>);
  exp_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kExp>);
  log_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kLog>);
  tanh_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kTanh>);
  sqrt_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kSqrt>);
  square_device.set(DeviceKind::kCUDA, &unary<UnaryOp::kSquare>);
  add_inplace_device.set(DeviceKind::kCUDA, &add_inplace);
  broadcast_to_device.set(DeviceKind::kCUDA, &broadcast_to);
  sum_to_shape_device.set(DeviceKind::kCUDA, &sum_to_shape);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_elementwise);

}  // namespace minidl::ops::cuda
