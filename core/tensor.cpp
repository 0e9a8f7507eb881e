#include "core/tensor.h"

#include <cstring>
#include <iomanip>

#include "core/parallel.h"

namespace minidl {

Storage::Storage(size_t bytes, Device device) : device_(device) {
  if (device.is_cpu()) {
    alloc_ = cpu_allocate(bytes);
    return;
  }
  backend_ = &device_backend(device, "allocate");
  if (bytes > 0) alloc_ = backend_->allocate(bytes, device.index);
}

Storage::~Storage() {
  if (backend_ == nullptr) {
    cpu_free(alloc_);
  } else if (alloc_.ptr != nullptr) {
    backend_->free(alloc_, device_.index);
  }
}

void Storage::release() {
  if (backend_ == nullptr) {
    cpu_free(alloc_);
  } else if (alloc_.ptr != nullptr) {
    backend_->free(alloc_, device_.index);
  }
  alloc_ = Allocation{};
}

void Storage::reallocate(size_t bytes) {
  MINIDL_ASSERT(alloc_.ptr == nullptr && alloc_.bytes == 0, "Storage::reallocate: the storage still holds ",
                alloc_.bytes, " bytes");
  if (backend_ == nullptr) {
    alloc_ = cpu_allocate(bytes);
  } else if (bytes > 0) {
    alloc_ = backend_->allocate(bytes, device_.index);
  }
}

void check_cpu_op(const char* op, const char* name, const Tensor& t) {
  MINIDL_CHECK(!t.defined() || t.device().is_cpu(), op, ": no kernel for ", t.device(), " in this build (got ", name,
               " on ", t.device(), "; move it with to(Device::cpu()))");
}

// Device tensors are read and written on the host through a mirror: a CPU tensor with the same shape, strides
// and dtype over a host copy of the bytes the view spans (strides are non-negative, so the span starts at the
// view's first element). `download` = false skips reading when every spanned byte will be overwritten.
static Tensor host_mirror(const Tensor& t, bool download) {
  int64_t span = t.numel() > 0 ? 1 : 0;
  for (int i = 0; i < t.dim() && span > 0; ++i) {
    MINIDL_ASSERT(t.stride(i) >= 0, "negative stride in ", t.strides());
    span += (t.size(i) - 1) * t.stride(i);
  }
  Tensor buffer = Tensor::empty(Shape{span}, t.dtype());
  Tensor mirror = buffer.as_strided(t.shape(), t.strides(), 0);
  if (download && span > 0)
    device_backend(t.device(), "read")
        .copy(buffer.raw_data(), Device::cpu(), t.raw_device_data(), t.device(), buffer.nbytes());
  return mirror;
}

// Writes a mirror's span back to the device tensor it was made from.
static void upload_mirror(const Tensor& mirror, const Tensor& t) {
  int64_t span = mirror.numel() > 0 ? 1 : 0;
  for (int i = 0; i < mirror.dim() && span > 0; ++i) span += (mirror.size(i) - 1) * mirror.stride(i);
  if (span > 0)
    device_backend(t.device(), "write")
        .copy(t.raw_device_data(), t.device(), mirror.raw_data(), Device::cpu(), size_t(span) * dtype_size(t.dtype()));
}

Strides contiguous_strides(const Shape& shape) {
  Strides s = shape;
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MINIDL_CHECK(d >= 0, "empty: dimensions must be >= 0, got shape ", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.raw_data(), 0, t.nbytes());
  } else if (t.nbytes() > 0) {
    device_backend(device, "zero").memset_zero(t.raw_device_data(), t.nbytes(), device.index);
  }
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }

template <class V>
static Tensor from_values(const std::vector<V>& values, const Shape& shape, DType dtype) {
  MINIDL_CHECK(int64_t(values.size()) == shape.numel(), "from_vector: ", values.size(), " values do not fill shape ",
               shape, " (", shape.numel(), " elements)");
  Tensor t = Tensor::empty(shape, dtype);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = from_double<T>(double(values[i]));
  });
  return t;
}
Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& s, DType dt) { return from_values(v, s, dt); }
Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& s, DType dt) { return from_values(v, s, dt); }
Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& s, DType dt) { return from_values(v, s, dt); }
Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& s, DType dt) { return from_values(v, s, dt); }

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return from_vector(v, Shape{n}, dtype);
}

template <class Draw>
static Tensor random_tensor(const Shape& shape, DType dtype, Device device, Draw draw) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = draw(uint64_t(i));
  if (dtype == DType::f32 && device.is_cpu()) return t;
  Tensor out = Tensor::empty(shape, dtype, device);
  out.copy_(t);  // converts and moves (core's raw copy: nothing recorded)
  return out;
}

Tensor Tensor::randn(const Shape& shape, const Philox& rng, DType dtype, Device device) {
  return random_tensor(shape, dtype, device, [&](uint64_t i) { return rng.normal(i); });
}

Tensor Tensor::rand(const Shape& shape, const Philox& rng, DType dtype, Device device) {
  return random_tensor(shape, dtype, device, [&](uint64_t i) { return rng.uniform(i); });
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] != 1 && impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

int Tensor::wrap_dim(int d) const {
  int n = dim();
  int w = d < 0 ? d + n : d;
  MINIDL_CHECK(w >= 0 && w < n, "dimension ", d, " is out of range for a tensor of shape ", shape());
  return w;
}

// Visits every element of t in row-major order as (element pointer). The innermost dimension is a tight loop.
template <class T, class Fn>
static void for_each_element(const Tensor& t, Fn&& fn) {
  T* base = static_cast<T*>(t.raw_data());
  int n = t.dim();
  if (t.is_contiguous() || n == 0) {
    for (int64_t i = 0, e = t.numel(); i < e; ++i) fn(base[i]);
    return;
  }
  int64_t idx[Shape::kMaxDims] = {};
  const Shape& sh = t.shape();
  const Strides& st = t.strides();
  int64_t total = t.numel(), inner = sh[n - 1], inner_stride = st[n - 1];
  for (int64_t done = 0; done < total; done += inner) {
    int64_t off = 0;
    for (int d = 0; d < n - 1; ++d) off += idx[d] * st[d];
    for (int64_t j = 0; j < inner; ++j) fn(base[off + j * inner_stride]);
    for (int d = n - 2; d >= 0; --d) {
      if (++idx[d] < sh[d]) break;
      idx[d] = 0;
    }
  }
}

// dst = src, elementwise, for one dtype and any strides: the rows of the last dimension, an odometer over the others.
static void copy_strided_rows(const Tensor& dst, const Tensor& src) {
  const int64_t total = dst.numel();
  if (total == 0) return;
  const size_t es = dtype_size(dst.dtype());
  auto* d = static_cast<char*>(dst.raw_data());
  const auto* s = static_cast<const char*>(src.raw_data());
  const int n = dst.dim();
  if (n == 0) {
    std::memcpy(d, s, es);
    return;
  }
  const Shape& sh = dst.shape();
  const Strides &ds = dst.strides(), &ss = src.strides();
  const int64_t inner = sh[n - 1], d_inner = ds[n - 1], s_inner = ss[n - 1];
  const bool dense = d_inner == 1 && s_inner == 1;
  int64_t idx[Shape::kMaxDims] = {};
  for (int64_t done = 0; done < total; done += inner) {
    int64_t d_off = 0, s_off = 0;
    for (int k = 0; k < n - 1; ++k) d_off += idx[k] * ds[k], s_off += idx[k] * ss[k];
    if (dense) {
      std::memcpy(d + size_t(d_off) * es, s + size_t(s_off) * es, size_t(inner) * es);
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + size_t(d_off + j * d_inner) * es, s + size_t(s_off + j * s_inner) * es, es);
    }
    for (int k = n - 2; k >= 0; --k) {
      if (++idx[k] < sh[k]) break;
      idx[k] = 0;
    }
  }
}

double Tensor::item() const {
  MINIDL_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", shape());
  return to_vector()[0];
}

std::vector<double> Tensor::to_vector() const {
  if (!device().is_cpu()) return host_mirror(*this, true).to_vector();
  std::vector<double> out;
  out.reserve(size_t(numel()));
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_element<T>(*this, [&](T& v) { out.push_back(to_double(v)); });
  });
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  if (device().is_cpu() && dtype() == DType::f32 && is_contiguous()) {  // one copy, not through doubles
    const float* p = data<float>();
    return {p, p + numel()};
  }
  std::vector<double> d = to_vector();
  return {d.begin(), d.end()};
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset_elems) const {
  MINIDL_ASSERT(shape.size() == strides.size());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + offset_elems * int64_t(dtype_size(dtype()));
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor& Tensor::copy_(const Tensor& src) {
  MINIDL_CHECK(src.shape() == shape(), "copy_: source shape ", src.shape(), " does not match destination shape ",
               shape());
  if (!device().is_cpu() || !src.device().is_cpu()) {
    if (dtype() == src.dtype() && is_contiguous() && src.is_contiguous()) {
      if (nbytes() > 0) {
        Device d = device().is_cpu() ? src.device() : device();
        device_backend(d, "copy").copy(raw_device_data(), device(), src.raw_device_data(), src.device(), nbytes());
      }
      return *this;
    }
    // Strided or converting: do it on the host, then write the destination's span back.
    Tensor host_src = src.device().is_cpu() ? src : host_mirror(src, true);
    if (device().is_cpu()) return copy_(host_src);
    Tensor host_dst = host_mirror(*this, !is_contiguous());
    host_dst.copy_(host_src);
    upload_mirror(host_dst, *this);
    return *this;
  }
  if (dtype() == src.dtype() && is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return *this;
  }
  // The same dtype, strided (a transpose made contiguous, sequence parallelism's (B, T, C) <-> (T, B, C)): row by row
  // over the last dimension, one memcpy per row where both rows are dense. Storage shared with the source could
  // overlap: that takes the general path, which reads the whole source first.
  if (dtype() == src.dtype() && impl_->storage != src.impl_->storage) {
    copy_strided_rows(*this, src);
    return *this;
  }
  if (is_contiguous() && src.is_contiguous() && dtype() == DType::f32) {
    float* d = data<float>();
    int64_t n = numel();
    if (src.dtype() == DType::bf16) {
      const bf16* s = src.data<bf16>();
      for (int64_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
      return *this;
    }
    if (src.dtype() == DType::f16) {
      const f16* s = src.data<f16>();
      for (int64_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
      return *this;
    }
  }
  // General path: gather the source in row-major order as double, then scatter.
  std::vector<double> values = src.to_vector();
  size_t k = 0;
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_element<T>(*this, [&](T& v) { v = from_double<T>(values[k++]); });
  });
  return *this;
}

Tensor& Tensor::fill_(double value) {
  if (!device().is_cpu() && is_contiguous()) {  // on the device, from the value's bytes: no copy of the tensor
    if (numel() == 0) return *this;
    dispatch_dtype(dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T v = from_double<T>(value);
      device_backend(device(), "fill").fill(raw_device_data(), numel(), &v, sizeof v, device().index);
    });
    return *this;
  }
  if (!device().is_cpu()) {
    Tensor host = host_mirror(*this, !is_contiguous());
    host.fill_(value);
    upload_mirror(host, *this);
    return *this;
  }
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    for_each_element<T>(*this, [&](T& e) { e = v; });
  });
  return *this;
}

void Tensor::set_data(const Tensor& src) {
  MINIDL_CHECK(defined() && src.defined(), "set_data: undefined tensor");
  impl_->storage = src.impl_->storage;
  impl_->offset = src.impl_->offset;
  impl_->shape = src.impl_->shape;
  impl_->strides = src.impl_->strides;
  impl_->dtype = src.impl_->dtype;
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), 0); }

Tensor& Tensor::set_requires_grad(bool value) {
  MINIDL_CHECK(is_leaf(), "set_requires_grad: only leaf tensors (not results of recorded ops) can be marked");
  MINIDL_CHECK(!value || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got ",
               dtype());
  impl_->autograd.requires_grad = value;
  return *this;
}

void Tensor::register_grad_ready_hook(GradReadyHook hook) {
  MINIDL_CHECK(requires_grad() && is_leaf(), "register_grad_ready_hook: expected a leaf that requires grad");
  impl_->autograd.grad_ready_hooks.push_back(std::move(hook));
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(shape=" << t.shape() << ", dtype=" << t.dtype() << ", device=" << t.device();
  {
    std::vector<double> v = t.to_vector();
    os << ", data=[";
    for (size_t i = 0; i < v.size() && i < 16; ++i) os << (i ? ", " : "") << std::setprecision(6) << v[i];
    if (v.size() > 16) os << ", ...";
    os << "]";
  }
  return os << ")";
}

}  // namespace minidl
