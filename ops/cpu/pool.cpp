// max_pool2d on the CPU (ops/conv.h). Channels last: the innermost loop runs over C contiguous channels, so
// both passes vectorise. Forward is parallel over output rows; backward over images, since overlapping windows
// (stride < kernel) of one image add into the same input pixels.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "ops/conv.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

namespace {

template <class T>
void pool_forward(const ConvGeometry& g, const T* x, T* y) {
  parallel_for(0, g.N * g.P, 4, [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      int64_t n = row / g.P, p = row % g.P;
      for (int64_t q = 0; q < g.Q; ++q) {
        T* out = y + ((row * g.Q) + q) * g.C;
        std::fill(out, out + g.C, -std::numeric_limits<T>::infinity());
        for (int64_t r = 0; r < g.R; ++r)
          for (int64_t s = 0; s < g.S; ++s) {
            const T* in = x + ((n * g.H + p * g.stride + r) * g.W + q * g.stride + s) * g.C;
            for (int64_t c = 0; c < g.C; ++c) out[c] = std::max(out[c], in[c]);
          }
      }
    }
  });
}

// Per output pixel: first the offset in the window of each channel's first maximum, in a select loop that
// vectorises over channels; then one add per channel.
template <class T>
void pool_backward(const ConvGeometry& g, const T* dy, const T* x, const T* y, T* dx) {
  parallel_for(0, g.N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<int32_t> offsets(size_t(g.C));
    int32_t* first = offsets.data();
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.H * g.W * g.C;
      T* dxn = dx + n * g.H * g.W * g.C;
      std::fill(dxn, dxn + g.H * g.W * g.C, T(0));
      for (int64_t p = 0; p < g.P; ++p)
        for (int64_t q = 0; q < g.Q; ++q) {
          const int64_t out = ((n * g.P + p) * g.Q + q) * g.C, corner = (p * g.stride * g.W + q * g.stride) * g.C;
          const T *yo = y + out, *dyo = dy + out;
          std::fill(first, first + g.C, -1);
          for (int64_t r = 0; r < g.R; ++r)
            for (int64_t s = 0; s < g.S; ++s) {
              const int32_t at = int32_t((r * g.W + s) * g.C);
              const T* in = xn + corner + at;
              for (int64_t c = 0; c < g.C; ++c) first[c] = first[c] < 0 && in[c] == yo[c] ? at : first[c];
            }
          for (int64_t c = 0; c < g.C; ++c)
            if (first[c] >= 0)  // no tap equals a NaN maximum: that window passes no gradient
              dxn[corner + first[c] + c] += dyo[c];
        }
    }
  });
}

}  // namespace

void max_pool2d_forward_cpu(const ConvGeometry& g, const float* x, float* y) { pool_forward(g, x, y); }
void max_pool2d_forward_cpu(const ConvGeometry& g, const double* x, double* y) { pool_forward(g, x, y); }
void max_pool2d_backward_cpu(const ConvGeometry& g, const float* dy, const float* x, const float* y, float* dx) {
  pool_backward(g, dy, x, y, dx);
}
void max_pool2d_backward_cpu(const ConvGeometry& g, const double* dy, const double* x, const double* y, double* dx) {
  pool_backward(g, dy, x, y, dx);
}

ConvGeometry check_pool2d(const char* op, const Tensor& x, const Pool2dOptions& o) {
  check_float(op, "x", x);
  MINIDL_CHECK(x.dim() == 4, op, ": expected x of shape (N, H, W, C) (channels last), got ", x.shape());
  MINIDL_CHECK(o.kernel >= 1, op, ": expected kernel >= 1, got ", o.kernel);
  MINIDL_CHECK(o.stride >= 1, op, ": expected stride >= 1, got ", o.stride);
  ConvGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), x.size(3), o.kernel, o.kernel, 0, 0, o.stride, 0, 1};
  MINIDL_CHECK(g.N > 0 && g.C > 0, op, ": expected non-empty x, got ", x.shape());
  MINIDL_CHECK(o.kernel <= g.H && o.kernel <= g.W, op, ": the ", o.kernel, "x", o.kernel, " window does not fit the ",
               g.H, "x", g.W, " input ", x.shape());
  g.P = (g.H - o.kernel) / o.stride + 1;
  g.Q = (g.W - o.kernel) / o.stride + 1;
  return g;
}

Tensor max_pool2d_forward(const Tensor& x, const Pool2dOptions& o) {
  ConvGeometry g = check_pool2d("max_pool2d", x, o);
  if (!x.device().is_cpu()) return max_pool2d_forward_device(x.device())(x, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.C}, x.dtype(), x.device());
  dispatch_float("max_pool2d", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    pool_forward<T>(g, x.data<T>(), y.data<T>());
  });
  return y;
}

Tensor max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  ConvGeometry g = check_pool2d("max_pool2d_backward", x, o);
  check_shaped_like("max_pool2d_backward", "y", y, Shape{g.N, g.P, g.Q, g.C}, x);
  check_shaped_like("max_pool2d_backward", "dy", dy, Shape{g.N, g.P, g.Q, g.C}, x);
  if (!x.device().is_cpu()) return max_pool2d_backward_device(x.device())(dy, x, y, o);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("max_pool2d_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    pool_backward<T>(g, dy.data<T>(), x.data<T>(), y.data<T>(), dx.data<T>());
  });
  return dx;
}

}  // namespace minidl::ops
