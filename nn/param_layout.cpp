#include "nn/param_layout.h"

#include <algorithm>

#include "core/error.h"
#include "nn/layers.h"

namespace minidl::nn {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t ParamLayout::full_numel() const {
  int64_t n = 1;
  for (int64_t d : full_shape) n *= d;
  return n;
}

Shape ParamLayout::local_shape() const {
  if (!is_split()) return full_shape;
  Shape s = full_shape;
  s[size_t(dim)] = parts * ceil_div(full_shape[size_t(dim)] / parts, ranks);
  return s;
}

std::vector<ParamLayout::Piece> ParamLayout::pieces() const {
  MINIDL_ASSERT(is_split(), "ParamLayout::pieces of a layout that is not split");
  const int64_t part = full_shape[size_t(dim)] / parts, slice = ceil_div(part, ranks);
  MINIDL_ASSERT(part * parts == full_shape[size_t(dim)], "ParamLayout: ", full_shape[size_t(dim)],
                " does not split into ", parts, " parts");
  std::vector<Piece> out;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t start = int64_t(rank) * slice, length = std::max<int64_t>(0, std::min(slice, part - start));
    if (length > 0) out.push_back({p * part + start, p * slice, length});
  }
  return out;
}

Tensor ParamLayout::slice(const Tensor& full) const {
  MINIDL_CHECK(full.shape() == full_shape, "expected a whole parameter of shape ", full_shape, ", got ", full.shape());
  const Tensor src = full.to(Device::cpu());
  Tensor local = Tensor::zeros(local_shape(), full.dtype());
  if (!is_split()) {
    local.copy_(src);
    return local;
  }
  for (const Piece& p : pieces())
    local.narrow(dim, p.local_start, p.length).copy_(src.narrow(dim, p.full_start, p.length));
  return local;
}

void ParamLayout::scatter_into(Tensor& full, const Tensor& local) const {
  MINIDL_ASSERT(local.shape() == local_shape(), "ParamLayout: local shape ", local.shape(), ", expected ",
                local_shape());
  if (!is_split()) {
    full.copy_(local);
    return;
  }
  for (const Piece& p : pieces()) {
    Tensor dst = full.narrow(dim, p.full_start, p.length);
    dst.copy_(local.narrow(dim, p.local_start, p.length));
  }
}

void ParamLayout::init_normal(Tensor& local, double std, uint64_t seed, uint64_t stream) const {
  if (!is_split()) {
    nn::init_normal(local, std, seed, stream);
    return;
  }
  for (const Piece& p : pieces()) {
    Shape s = full_shape;
    s[size_t(dim)] = p.length;
    Tensor piece = Tensor::empty(s);
    nn::init_normal_slice(piece, std, seed, stream, full_shape, dim, p.full_start);
    local.narrow(dim, p.local_start, p.length).copy_(piece);
  }
}

ParamLayout layout_of(const Tensor& p) {
  MINIDL_ASSERT(p.defined(), "layout_of an undefined tensor");
  const auto& stored = p.impl()->autograd.layout;
  if (stored) return *stored;
  ParamLayout whole;
  whole.full_shape = p.shape();
  return whole;
}

void set_layout(const Tensor& p, const ParamLayout& layout) {
  MINIDL_ASSERT(p.defined(), "set_layout on an undefined tensor");
  MINIDL_ASSERT(p.shape() == layout.local_shape(), "set_layout: the tensor's shape ", p.shape(),
                " is not the layout's local shape ", layout.local_shape());
  p.impl()->autograd.layout = std::make_shared<const ParamLayout>(layout);
}

}  // namespace minidl::nn
