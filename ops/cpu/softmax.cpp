// Softmax over the last dimension on the CPU, parallel over rows. f32 rows run ops/cpu/simd's vector code; f64
// the scalar loops, which are its reference.
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cpu/simd/simd.h"
#include "ops/softmax.h"

namespace minidl::ops {

Tensor softmax_forward(const Tensor& x) {
  check_softmax(x);
  if (!x.device().is_cpu()) return softmax_forward_device(x.device())(x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  int64_t V = x.size(-1), rows = x.numel() / V;
  dispatch_float("softmax", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * V;
        T* yr = py + r * V;
        if constexpr (std::is_same_v<T, float>) {
          float m = simd::max_row(xr, V);
          const float* next = r + 1 < r1 ? xr + V : nullptr;
          simd::scale_row(yr, 1.0f / simd::exp_sub_sum(xr, m, yr, V, next), V);
          continue;
        }
        // Subtracting the row max keeps exp() <= 1: no overflow for large logits, same result.
        T m = xr[0];
        for (int64_t j = 1; j < V; ++j) m = xr[j] > m ? xr[j] : m;
        T s = 0;
        for (int64_t j = 0; j < V; ++j) {
          yr[j] = std::exp(xr[j] - m);
          s += yr[j];
        }
        T inv = T(1) / s;
        for (int64_t j = 0; j < V; ++j) yr[j] *= inv;
      }
    });
  });
  return y;
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  check_softmax(y);
  check_shaped_like("softmax_backward", "dy", dy, y.shape(), y);
  if (!y.device().is_cpu()) return softmax_backward_device(y.device())(dy, y);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  int64_t V = y.size(-1), rows = y.numel() / V;
  dispatch_float("softmax_backward", y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *py = y.data<T>(), *pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T *yr = py + r * V, *dyr = pdy + r * V;
        if constexpr (std::is_same_v<T, float>) {
          simd::mul_sub_row(yr, dyr, simd::dot_row(dyr, yr, V), pdx + r * V, V);
          continue;
        }
        T dot = 0;
        for (int64_t j = 0; j < V; ++j) dot += dyr[j] * yr[j];
        for (int64_t j = 0; j < V; ++j) pdx[r * V + j] = yr[j] * (dyr[j] - dot);
      }
    });
  });
  return dx;
}

}  // namespace minidl::ops
