// Layer norm on the CPU, parallel over rows. Statistics are accumulated in double: a row of C floats summed in
// float loses digits that the gradient check and long rows both notice, and it costs nothing measurable.
// f32 rows run ops/cpu/simd's vector code; f64 (the gradient-check path) the scalar loops below, its reference.
// 16-bit x is computed by the f32 op on its exact f32 copy, y and dx rounded once to x's dtype (the CUDA kernels
// read 16-bit storage directly and compute the same f32 math).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cpu/simd/simd.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"

namespace minidl::ops {

// dweight/dbias partial sums cover this many rows each; the partials are then added in order. Fixed (not one per
// thread) so the result is the same whatever the thread count.
static constexpr int64_t kRowsPerPartial = 64;

// Layer norm of the rows of x, f32 or f64, contiguous. With `other` defined, x is first summed with it row by row
// into f.sum (add_layernorm): each sum row is normalised while it is still in L1, one pass over memory and one
// parallel region instead of an add and then a layer norm. Without it f.sum is undefined.
static AddLayerNormForward layernorm_rows(const Tensor& x, const Tensor& other, const Tensor& weight,
                                          const Tensor& bias, double eps) {
  const int64_t C = weight.numel(), rows = x.numel() / C;
  AddLayerNormForward f{other.defined() ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                        Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, x.dtype(), x.device()),
                        Tensor::empty({rows}, x.dtype(), x.device())};
  dispatch_float("layernorm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *po = other.defined() ? other.data<T>() : nullptr, *w = weight.data<T>(),
            *b = bias.data<T>();
    T *ps = po ? f.sum.data<T>() : nullptr, *py = f.y.data<T>(), *mean = f.mean.data<T>(), *rstd = f.rstd.data<T>();
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * C;
        if (po) {
          T* __restrict sr = ps + r * C;
          const T* __restrict ar = xr;
          const T* __restrict br = po + r * C;
          for (int64_t c = 0; c < C; ++c) sr[c] = ar[c] + br[c];
          xr = sr;
        }
        if constexpr (std::is_same_v<T, float>) {
          const float* next = r + 1 < r1 && !po ? xr + C : nullptr;  // a sum row is written just before: in L1
          simd::layernorm_forward_row(xr, w, b, py + r * C, mean + r, rstd + r, eps, C, next);
          continue;
        }
        double s = 0, ss = 0;
        for (int64_t c = 0; c < C; ++c) s += xr[c];
        double mu = s / C;
        // Two-pass variance: sum of squared deviations, no cancellation when |mean| >> std.
        for (int64_t c = 0; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
        T m = T(mu), rs = T(1.0 / std::sqrt(ss / C + eps));
        T* yr = py + r * C;
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
        mean[r] = m;
        rstd[r] = rs;
      }
    });
  });
  return f;
}

LayerNormForward layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  int64_t C = check_layernorm("layernorm", x, weight);
  check_layernorm_param("layernorm", "bias", bias, Shape{C}, x);
  MINIDL_CHECK(eps > 0, "layernorm: expected eps > 0, got ", eps);
  if (!x.device().is_cpu()) return layernorm_forward_device(x.device())(x, weight, bias, eps);
  if (is_half(x.dtype())) {
    LayerNormForward f = layernorm_forward(upcast(x), weight, bias, eps);
    f.y = cast(f.y, x.dtype());
    return f;
  }
  const AddLayerNormForward f = layernorm_rows(x, Tensor(), weight, bias, eps);
  return {f.y, f.mean, f.rstd};
}

// layernorm_backward's CPU loops for f32 and f64; dsum (optional, contiguous, x's shape): dx += dsum, in the same
// pass, with the bits of the add after it (add_layernorm_backward: one pass over the rows instead of two, and one
// parallel region fewer per block).
static LayerNormBackward layernorm_backward_rows(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                                 const Tensor& mean, const Tensor& rstd, const Tensor& dsum) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  LayerNormBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device()),
                      Tensor::empty({C}, x.dtype(), x.device())};
  dispatch_float("layernorm_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pdy = dy.data<T>(), *w = weight.data<T>();
    const T *pmean = mean.data<T>(), *prstd = rstd.data<T>();
    T* pdx = g.dx.data<T>();
    const T* pdsum = dsum.defined() ? dsum.data<T>() : nullptr;
    int64_t blocks = std::max<int64_t>(1, (rows + kRowsPerPartial - 1) / kRowsPerPartial);
    // Per block: dweight, dbias, each zeroed by the thread that fills it.
    Tensor partials = Tensor::empty({blocks, 2, C}, x.dtype(), x.device());
    T* partial = partials.data<T>();
    parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        T* dw = partial + k * 2 * C;
        T* db = dw + C;
        std::fill(dw, dw + 2 * C, T(0));
        for (int64_t r = k * kRowsPerPartial, r1 = std::min(rows, r + kRowsPerPartial); r < r1; ++r) {
          const T *xr = px + r * C, *dyr = pdy + r * C;
          T m = pmean[r], rs = prstd[r];
          if constexpr (std::is_same_v<T, float>) {
            simd::layernorm_backward_row(dyr, xr, w, m, rs, pdx + r * C, dw, db, C, pdsum ? pdsum + r * C : nullptr);
            continue;
          }
          T sum_g = 0, sum_gx = 0;
          for (int64_t c = 0; c < C; ++c) {
            T xhat = (xr[c] - m) * rs, gc = dyr[c] * w[c];
            sum_g += gc;
            sum_gx += gc * xhat;
            dw[c] += dyr[c] * xhat;
            db[c] += dyr[c];
          }
          T mean_g = sum_g / T(C), mean_gx = sum_gx / T(C);
          T* dxr = pdx + r * C;
          for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * w[c] - mean_g - (xr[c] - m) * rs * mean_gx);
          if (pdsum)
            for (int64_t c = 0; c < C; ++c) dxr[c] += pdsum[r * C + c];
        }
      }
    });
    T *dw = g.dweight.data<T>(), *db = g.dbias.data<T>();
    std::fill(dw, dw + C, T(0));
    std::fill(db, db + C, T(0));
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t c = 0; c < C; ++c) {
        dw[c] += partial[k * 2 * C + c];
        db[c] += partial[k * 2 * C + C + c];
      }
  });
  return g;
}

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum_rows dy * xhat,  dbias = sum_rows dy.
LayerNormBackward layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd) {
  int64_t C = check_layernorm("layernorm_backward", x, weight);
  int64_t rows = x.numel() / C;
  check_shaped_like("layernorm_backward", "dy", dy, x.shape(), x);
  check_layernorm_param("layernorm_backward", "mean", mean, Shape{rows}, x);
  check_layernorm_param("layernorm_backward", "rstd", rstd, Shape{rows}, x);
  if (!x.device().is_cpu()) return layernorm_backward_device(x.device())(dy, x, weight, mean, rstd);
  if (is_half(x.dtype())) {
    LayerNormBackward g = layernorm_backward(upcast(dy), upcast(x), weight, mean, rstd);
    g.dx = cast(g.dx, x.dtype());
    return g;
  }
  return layernorm_backward_rows(dy, x, weight, mean, rstd, Tensor());
}

// The CPU computes the fused op with the bits of the two ops it replaces, so that it is their bitwise reference:
// the add (16-bit operands in f32, rounded once) and the layernorm; in backward the layer norm's dx, then the
// autograd engine's ops::add of the gradients (for f32 and f64 in the same pass, layernorm_backward_rows).
AddLayerNormForward add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                          double eps) {
  int64_t C = check_layernorm("add_layernorm", a, weight);
  check_shaped_like("add_layernorm", "b", b, a.shape(), a);
  check_layernorm_param("add_layernorm", "bias", bias, Shape{C}, a);
  MINIDL_CHECK(eps > 0, "add_layernorm: expected eps > 0, got ", eps);
  if (!a.device().is_cpu()) return add_layernorm_forward_device(a.device())(a, b, weight, bias, eps);
  if (is_half(a.dtype())) {  // the sum rounded to a's dtype, as the device kernels store it, then layer norm
    Tensor sum = add(a, b);
    LayerNormForward f = layernorm_forward(sum, weight, bias, eps);
    return {sum, f.y, f.mean, f.rstd};
  }
  return layernorm_rows(a, b, weight, bias, eps);
}

LayerNormBackward add_layernorm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& weight,
                                         const Tensor& mean, const Tensor& rstd) {
  int64_t C = check_layernorm("add_layernorm_backward", sum, weight);
  int64_t rows = sum.numel() / C;
  check_shaped_like("add_layernorm_backward", "dy", dy, sum.shape(), sum);
  if (dsum.defined()) check_shaped_like("add_layernorm_backward", "dsum", dsum, sum.shape(), sum);
  check_layernorm_param("add_layernorm_backward", "mean", mean, Shape{rows}, sum);
  check_layernorm_param("add_layernorm_backward", "rstd", rstd, Shape{rows}, sum);
  if (!sum.device().is_cpu()) return add_layernorm_backward_device(sum.device())(dy, dsum, sum, weight, mean, rstd);
  if (!dsum.defined() || is_half(sum.dtype())) {  // 16-bit: the layer norm's dx rounded to its dtype before the add
    LayerNormBackward g = layernorm_backward(dy, sum, weight, mean, rstd);
    if (dsum.defined()) g.dx = add(g.dx, dsum);
    return g;
  }
  return layernorm_backward_rows(dy, sum, weight, mean, rstd, dsum.contiguous());
}

}  // namespace minidl::ops
