#include "ops/elementwise.h"

namespace minidl::ops {

Tensor add(const Tensor& a, const Tensor& b) {
  MINIDL_CHECK(a.shape() == b.shape(), "add: shapes ", a.shape(), " and ", b.shape(), " differ");
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  out.copy_(a);
  add_(out, b);
  return out;
}

void add_(Tensor& dst, const Tensor& src) {
  MINIDL_CHECK(dst.shape() == src.shape(), "add_: shapes ", dst.shape(), " and ", src.shape(), " differ");
  dispatch_float("add_", dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor s = src.dtype() == dst.dtype() && src.is_contiguous() ? src : src.detach().contiguous().to(dst.dtype());
    T* d = dst.data<T>();
    const T* p = s.data<T>();
    for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += p[i];
  });
}

}  // namespace minidl::ops
