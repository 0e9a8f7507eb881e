#include "ops/reduce.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops {

namespace {

// Work (elements read) per thread below which splitting does not pay.
constexpr int64_t kReduceGrain = 32768;

// Calls fn(o, i0, i1) for output row o and its columns [i0, i1), splitting all outer * inner output elements
// over threads; each output element reads n inputs. Splitting columns too keeps both threads busy when outer is
// small, e.g. a bias gradient (1, N, C).
template <class Fn>
void for_output_ranges(const DimLayout& l, const Fn& fn) {
  parallel_for(0, l.outer * l.inner, std::max<int64_t>(1, kReduceGrain / std::max<int64_t>(l.n, 1)),
               [&](int64_t c0, int64_t c1) {
                 while (c0 < c1) {
                   int64_t o = c0 / l.inner, i0 = c0 % l.inner, i1 = std::min(l.inner, i0 + (c1 - c0));
                   fn(o, i0, i1);
                   c0 += i1 - i0;
                 }
               });
}

// A contiguous tensor with x's values and no autograd history (copies only if x is a strided view).
Tensor contiguous_data(const Tensor& x) { return x.detach().contiguous(); }

}  // namespace

Shape reduced_shape(const Shape& shape, int dim, bool keepdim) {
  Shape out;
  for (int i = 0; i < shape.size(); ++i) {
    if (i != dim)
      out.push_back(shape[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Tensor sum(const Tensor& x) {
  MINIDL_CHECK(x.defined(), "sum: undefined input");
  if (!x.device().is_cpu()) return sum_device(x.device())(x);
  if (is_half(x.dtype())) return cast(sum(upcast(x)), x.dtype());
  return dispatch_float("sum", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor xc = contiguous_data(x);
    const T* p = xc.data<T>();
    int64_t n = xc.numel();
    // Fixed chunks summed in order: the result does not depend on the thread count.
    int64_t chunks = std::max<int64_t>(1, (n + kReduceGrain - 1) / kReduceGrain);
    std::vector<double> partial(size_t(chunks), 0.0);
    parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double acc = 0;
        for (int64_t i = c * kReduceGrain, e = std::min(n, i + kReduceGrain); i < e; ++i) acc += double(p[i]);
        partial[size_t(c)] = acc;
      }
    });
    double total = 0;
    for (double v : partial) total += v;
    return Tensor::scalar(total, x.dtype());
  });
}

Tensor mean(const Tensor& x) {
  MINIDL_CHECK(x.numel() > 0, "mean: cannot average an empty tensor of shape ", x.shape());
  if (!x.device().is_cpu()) return mean_device(x.device())(x);
  return Tensor::scalar(sum(x).item() / double(x.numel()), x.dtype());
}

Tensor max(const Tensor& x) {
  MINIDL_CHECK(x.defined(), "max: undefined input");
  MINIDL_CHECK(x.numel() > 0, "max: cannot reduce an empty tensor of shape ", x.shape());
  if (!x.device().is_cpu()) return max_device(x.device())(x);
  return dispatch_float("max", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor xc = contiguous_data(x);
    const T* p = xc.data<T>();
    T best = p[0];
    for (int64_t i = 1, n = xc.numel(); i < n && !std::isnan(best); ++i)
      if (p[i] > best || std::isnan(p[i])) best = p[i];
    return Tensor::scalar(double(best), x.dtype());
  });
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  MINIDL_CHECK(x.defined(), "sum: undefined input");
  int d = x.wrap_dim(dim);
  if (!x.device().is_cpu()) return sum_dim_device(x.device())(x, d, keepdim);
  if (is_half(x.dtype())) return cast(sum(upcast(x), d, keepdim), x.dtype());
  return dispatch_float("sum", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor xc = contiguous_data(x);
    DimLayout l = layout_of(x.shape(), d);
    Tensor out = Tensor::zeros(reduced_shape(x.shape(), d, keepdim), x.dtype(), x.device());
    const T* p = xc.data<T>();
    T* o = out.data<T>();
    for_output_ranges(l, [&](int64_t r, int64_t i0, int64_t i1) {
      const T* row = p + r * l.n * l.inner;
      T* dst = o + r * l.inner;
      if (l.inner == 1) {
        double acc = 0;
        for (int64_t j = 0; j < l.n; ++j) acc += double(row[j]);
        dst[0] = T(acc);
        return;
      }
      // Each column adds the rows in order (j outermost), so the bits do not depend on how columns are split.
      if constexpr (std::is_same_v<T, float>) {
        simd::add_rows(row + i0, l.n, l.inner, dst + i0, i1 - i0);
        return;
      }
      for (int64_t j = 0; j < l.n; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[i] += row[j * l.inner + i];
    });
    return out;
  });
}

Tensor mean(const Tensor& x, int dim, bool keepdim) {
  MINIDL_CHECK(x.defined(), "mean: undefined input");
  int d = x.wrap_dim(dim);
  MINIDL_CHECK(x.size(d) > 0, "mean: cannot average over empty dimension ", d, " of shape ", x.shape());
  if (!x.device().is_cpu()) return mean_dim_device(x.device())(x, d, keepdim);
  if (is_half(x.dtype())) return cast(mean(upcast(x), d, keepdim), x.dtype());
  Tensor s = sum(x, d, keepdim);
  dispatch_float("mean", s.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T scale = T(1.0 / double(x.size(d)));
    T* p = s.data<T>();
    for (int64_t i = 0, n = s.numel(); i < n; ++i) p[i] *= scale;
  });
  return s;
}

MaxResult max(const Tensor& x, int dim, bool keepdim) {
  MINIDL_CHECK(x.defined(), "max: undefined input");
  int d = x.wrap_dim(dim);
  MINIDL_CHECK(x.size(d) > 0, "max: cannot reduce over empty dimension ", d, " of shape ", x.shape());
  if (!x.device().is_cpu()) return max_dim_device(x.device())(x, d, keepdim);
  return dispatch_float("max", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor xc = contiguous_data(x);
    DimLayout l = layout_of(x.shape(), d);
    Shape rs = reduced_shape(x.shape(), d, keepdim);
    MaxResult r{Tensor::empty(rs, x.dtype(), x.device()), Tensor::empty(rs, DType::i64, x.device())};
    const T* p = xc.data<T>();
    T* val = r.values.data<T>();
    int64_t* idx = r.indices.data<int64_t>();
    for_output_ranges(l, [&](int64_t o, int64_t i0, int64_t i1) {
      const T* base = p + o * l.n * l.inner;
      for (int64_t i = i0; i < i1; ++i) {
        T best = base[i];
        int64_t arg = 0;
        // Strict '>' keeps the first maximum; a NaN wins and then stays.
        for (int64_t j = 1; j < l.n && !std::isnan(best); ++j) {
          T v = base[j * l.inner + i];
          if (v > best || std::isnan(v)) best = v, arg = j;
        }
        val[o * l.inner + i] = best;
        idx[o * l.inner + i] = arg;
      }
    });
    return r;
  });
}

Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& input_shape, int dim) {
  int nd = input_shape.size();
  int d = dim < 0 ? dim + nd : dim;
  MINIDL_CHECK(d >= 0 && d < nd, "max_backward: dimension ", dim, " is out of range for shape ", input_shape);
  MINIDL_CHECK(grad.numel() == indices.numel() && grad.numel() * input_shape[d] == input_shape.numel(),
               "max_backward: gradient ", grad.shape(), " and indices ", indices.shape(), " do not match input shape ",
               input_shape, " reduced over dimension ", d);
  MINIDL_CHECK(indices.dtype() == DType::i64, "max_backward: expected i64 indices, got ", indices.dtype());
  MINIDL_CHECK(grad.device() == indices.device(), "max_backward: gradient on ", grad.device(), " and indices on ",
               indices.device());
  if (!grad.device().is_cpu()) return max_backward_device(grad.device())(grad, indices, input_shape, d);
  return dispatch_float("max_backward", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor gc = contiguous_data(grad), ic = contiguous_data(indices);
    DimLayout l = layout_of(input_shape, d);
    Tensor out = Tensor::zeros(input_shape, grad.dtype(), grad.device());
    const T* g = gc.data<T>();
    const int64_t* idx = ic.data<int64_t>();
    T* o = out.data<T>();
    parallel_for(0, l.outer, std::max<int64_t>(1, kReduceGrain / std::max<int64_t>(l.inner, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r)
                     for (int64_t i = 0; i < l.inner; ++i) {
                       int64_t k = r * l.inner + i;
                       o[(r * l.n + idx[k]) * l.inner + i] = g[k];
                     }
                 });
    return out;
  });
}

}  // namespace minidl::ops
