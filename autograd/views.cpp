// Differentiable views and conversions (members of Tensor, declared in core/tensor.h).
#include "autograd/functions.h"
#include "autograd/node.h"

namespace minidl {

// Resolves one -1 in `shape` against numel.
static Shape infer_shape(const Shape& requested, int64_t numel) {
  Shape s = requested;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MINIDL_CHECK(infer < 0, "reshape: only one dimension can be -1, got ", requested);
      infer = i;
    } else {
      MINIDL_CHECK(s[i] >= 0, "reshape: invalid dimension ", s[i], " in ", requested);
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MINIDL_CHECK(known > 0 && numel % known == 0, "reshape: cannot infer -1 in ", requested, " for ", numel,
                 " elements");
    s[infer] = numel / known;
  }
  MINIDL_CHECK(s.numel() == numel, "reshape: shape ", requested, " does not hold ", numel, " elements");
  return s;
}

Tensor Tensor::view(const Shape& requested) const {
  Shape s = infer_shape(requested, numel());
  MINIDL_CHECK(is_contiguous(), "view: tensor of shape ", shape(), " is not contiguous; use reshape()");
  Shape in_shape = shape();
  Tensor out = as_strided(s, contiguous_strides(s), 0);
  return autograd::record("view", {*this}, out,
                          [in_shape](const Tensor& g) { return std::vector<Tensor>{g.reshape(in_shape)}; });
}

Tensor Tensor::reshape(const Shape& requested) const {
  if (is_contiguous()) return view(requested);
  return contiguous().view(requested);
}

Tensor Tensor::transpose(int d0, int d1) const {
  int a = wrap_dim(d0), b = wrap_dim(d1);
  Shape s = shape();
  Strides st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  Tensor out = as_strided(s, st, 0);
  return autograd::record("transpose", {*this}, out,
                          [a, b](const Tensor& g) { return std::vector<Tensor>{g.transpose(a, b)}; });
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  int d = wrap_dim(dim);
  MINIDL_CHECK(start >= 0 && length >= 0 && start + length <= size(d), "narrow: range [", start, ", ", start + length,
               ") is out of bounds for dimension ", d, " of size ", size(d));
  Shape s = shape();
  s[d] = length;
  Tensor out = as_strided(s, strides(), start * stride(d));
  Shape in_shape = shape();
  DType dt = dtype();
  return autograd::record("narrow", {*this}, out, [in_shape, dt, d, start, length](const Tensor& g) {
    Tensor gi = Tensor::zeros(in_shape, dt, g.device());
    gi.detach().narrow(d, start, length).copy_(g);
    return std::vector<Tensor>{gi};
  });
}

Tensor cat(std::initializer_list<Tensor> parts, int dim) { return cat(std::vector<Tensor>(parts), dim); }

Tensor cat(const std::vector<Tensor>& parts, int dim) {
  MINIDL_CHECK(parts.size() >= 1, "cat: expected at least one tensor");
  const Tensor& first = *parts.begin();
  const int d = first.wrap_dim(dim);
  Shape shape = first.shape();
  shape[d] = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& p : parts) {
    Shape s = p.shape();
    MINIDL_CHECK(s.size() == first.dim() && p.dtype() == first.dtype() && p.device() == first.device(),
                 "cat: expected tensors of one rank, dtype and device, got ", first.shape(), " and ", s);
    s[d] = 0;
    Shape others = shape;
    others[d] = 0;
    MINIDL_CHECK(s == others, "cat: expected equal sizes but along dimension ", d, ", got ", first.shape(), " and ",
                 p.shape());
    sizes.push_back(p.size(d));
    shape[d] += p.size(d);
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    out.narrow(d, at, p.size(d)).copy_(p.detach());
    at += p.size(d);
  }
  return autograd::record("cat", parts, out, [d, sizes](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t n : sizes) {
      grads.push_back(g.narrow(d, start, n).contiguous());
      start += n;
    }
    return grads;
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  out.copy_(*this);
  return autograd::record("clone", {*this}, out, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), dt, device());
  out.copy_(*this);
  DType in_dt = dtype();
  return autograd::record("cast", {*this}, out, [in_dt](const Tensor& g) { return std::vector<Tensor>{g.to(in_dt)}; });
}

// A copy on `dev` (contiguous); its gradient is moved back to this tensor's device.
Tensor Tensor::to(Device dev) const {
  if (dev == device()) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), dev);
  out.copy_(*this);
  Device in_dev = device();
  return autograd::record("to_device", {*this}, out,
                          [in_dev](const Tensor& g) { return std::vector<Tensor>{g.to(in_dev)}; });
}

}  // namespace minidl
