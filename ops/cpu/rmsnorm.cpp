// RMS norm on the CPU, parallel over rows. The sum of squares is accumulated in double (as layer norm's
// statistics). f32 rows run ops/cpu/simd's vector code; f64 (the gradient-check path) the scalar loops below, its
// reference. 16-bit x is computed on its exact f32 copy: xhat rounded to x's dtype, then the weight, then rounded
// again (ops/rmsnorm.h); the CUDA kernels read 16-bit storage directly and compute the same f32 math.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"
#include "ops/elementwise.h"
#include "ops/rmsnorm.h"

namespace minidl::ops {

// dweight partial sums cover this many rows each, then are added in order: thread-count independent bits.
static constexpr int64_t kRowsPerPartial = 64;

// x rounded to `dt` (f16 or bf16) and back: the value an f32 result has once stored in dt.
static float rounded_to(float x, DType dt) { return dt == DType::bf16 ? to_float(to_bf16(x)) : to_float(to_f16(x)); }

// y = xhat * weight of the rows of x (f32 or f64, contiguous), xhat alone with weight undefined.
static RMSNormForward rmsnorm_rows(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  RMSNormForward f{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, x.dtype(), x.device())};
  dispatch_float("rmsnorm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *w = weight.defined() ? weight.data<T>() : nullptr;
    T *py = f.y.data<T>(), *rstd = f.rstd.data<T>();
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * C;
        T* yr = py + r * C;
        if constexpr (std::is_same_v<T, float>) {
          rstd[r] = simd::rmsnorm_forward_row(xr, w, yr, eps, C);
          continue;
        }
        double ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
        const T rs = T(1.0 / std::sqrt(ss / C + eps));
        for (int64_t c = 0; c < C; ++c) yr[c] = w ? xr[c] * rs * w[c] : xr[c] * rs;
        rstd[r] = rs;
      }
    });
  });
  return f;
}

RMSNormForward rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps) {
  check_layernorm("rmsnorm", x, weight);
  MINIDL_CHECK(eps > 0, "rmsnorm: expected eps > 0, got ", eps);
  if (!x.device().is_cpu()) return rmsnorm_forward_device(x.device())(x, weight, eps);
  if (is_half(x.dtype())) {  // xhat rounded to x's dtype before the weight (transformers #30236)
    RMSNormForward f = rmsnorm_rows(upcast(x), Tensor(), eps);
    f.y = cast(mul(upcast(cast(f.y, x.dtype())), weight), x.dtype());
    return f;
  }
  return rmsnorm_rows(x, weight, eps);
}

// The rows of dy and x in f32 or f64; `rounding` (f16 or bf16, or f32 for none): the dtype xhat was rounded to
// before the weight in the forward, which dweight's products take.
static RMSNormBackward rmsnorm_backward_rows(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                             const Tensor& rstd, DType rounding) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  RMSNormBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::zeros({C}, x.dtype(), x.device())};
  dispatch_float("rmsnorm_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pdy = dy.data<T>(), *w = weight.data<T>(), *prstd = rstd.data<T>();
    T* pdx = g.dx.data<T>();
    const int64_t blocks = std::max<int64_t>(1, (rows + kRowsPerPartial - 1) / kRowsPerPartial);
    Tensor partials = Tensor::empty({blocks, C}, x.dtype(), x.device());  // each zeroed by the thread that fills it
    T* partial = partials.data<T>();
    parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      std::vector<T> xhat_rounded(is_half(rounding) ? size_t(C) : 0);
      for (int64_t k = k0; k < k1; ++k) {
        T* dw = partial + k * C;
        std::fill(dw, dw + C, T(0));
        for (int64_t r = k * kRowsPerPartial, r1 = std::min(rows, r + kRowsPerPartial); r < r1; ++r) {
          const T *xr = px + r * C, *dyr = pdy + r * C;
          const T rs = prstd[r];
          T* dxr = pdx + r * C;
          if constexpr (std::is_same_v<T, float>) {
            if (is_half(rounding))
              for (int64_t c = 0; c < C; ++c) xhat_rounded[size_t(c)] = rounded_to(xr[c] * rs, rounding);
            simd::rmsnorm_backward_row(dyr, xr, w, rs, dxr, dw, C, is_half(rounding) ? xhat_rounded.data() : nullptr);
            continue;
          }
          T sum_gx = 0;
          for (int64_t c = 0; c < C; ++c) {
            const T xhat = xr[c] * rs;
            sum_gx += dyr[c] * w[c] * xhat;
            dw[c] += dyr[c] * xhat;
          }
          const T mean_gx = sum_gx / T(C);
          for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * w[c] - xr[c] * rs * mean_gx);
        }
      }
    });
    T* dw = g.dweight.data<T>();
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t c = 0; c < C; ++c) dw[c] += partial[k * C + c];
  });
  return g;
}

RMSNormBackward rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const int64_t C = check_layernorm("rmsnorm_backward", x, weight), rows = x.numel() / C;
  check_shaped_like("rmsnorm_backward", "dy", dy, x.shape(), x);
  check_layernorm_param("rmsnorm_backward", "rstd", rstd, Shape{rows}, x);
  if (!x.device().is_cpu()) return rmsnorm_backward_device(x.device())(dy, x, weight, rstd);
  if (is_half(x.dtype())) {
    RMSNormBackward g = rmsnorm_backward_rows(upcast(dy), upcast(x), weight, rstd, x.dtype());
    g.dx = cast(g.dx, x.dtype());
    return g;
  }
  return rmsnorm_backward_rows(dy, x, weight, rstd, DType::f32);
}

}  // namespace minidl::ops
