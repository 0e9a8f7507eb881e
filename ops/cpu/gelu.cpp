// GELU and bias + GELU on the CPU: elementwise loops over contiguous memory, parallel over elements (gelu) or
// rows (bias_gelu, whose bias gradient is a column sum). f32 runs ops/cpu/simd's vector code; f64 (the
// gradient-check path) the scalar reference of ops/kernels/gelu.h with std::exp.
#include <algorithm>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/gelu.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/gelu.h"

namespace minidl::ops {

// Elements per parallel chunk: enough work to amortise waking a thread (a tanh is ~20 ns).
static constexpr int64_t kElementGrain = 4096;

// dbias partial sums cover this many rows each, then are added in order: thread-count independent bits.
static constexpr int64_t kRowsPerPartial = 64;

Tensor gelu_forward(const Tensor& x) {
  check_float_or_half("gelu", "x", x);
  if (!x.device().is_cpu()) return gelu_forward_device(x.device())(x);
  if (is_half(x.dtype()) && x.dim() == 0) return cast(gelu_forward(upcast(x)), x.dtype());
  if (is_half(x.dtype())) {  // f32 a block of rows at a time (ops/cast.h)
    Tensor rows = x.contiguous().detach().view({x.size(0), x.numel() / std::max<int64_t>(x.size(0), 1)});
    return half_by_row_blocks(rows, Shape{rows.size(1)}, [](const Tensor& xb) { return gelu_forward(xb); })
        .view(x.shape());
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("gelu", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(0, x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        simd::gelu_row(px + b, nullptr, py + b, e - b);
      else
        for (int64_t i = b; i < e; ++i) py[i] = kernels::gelu_tanh(px[i]);
    });
  });
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x) {
  check_float_or_half("gelu_backward", "x", x);
  check_shaped_like("gelu_backward", "dy", dy, x.shape(), x);
  if (!x.device().is_cpu()) return gelu_backward_device(x.device())(dy, x);
  if (is_half(x.dtype())) return cast(gelu_backward(upcast(dy), upcast(x)), x.dtype());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("gelu_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(0, x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        simd::gelu_backward_row(pdy + b, px + b, nullptr, pdx + b, nullptr, e - b);
      else
        for (int64_t i = b; i < e; ++i) pdx[i] = pdy[i] * kernels::gelu_tanh_grad(px[i]);
    });
  });
  return dx;
}

Tensor bias_gelu_forward(const Tensor& x, const Tensor& bias) {
  int64_t C = check_bias_gelu("bias_gelu", x, bias);
  if (!x.device().is_cpu()) return bias_gelu_forward_device(x.device())(x, bias);
  if (is_half(x.dtype())) {  // f32 a block of rows at a time (ops/cast.h)
    Tensor b32 = upcast(bias);
    Tensor rows = x.contiguous().detach().view({x.numel() / std::max<int64_t>(C, 1), C});
    return half_by_row_blocks(rows, Shape{C}, [&](const Tensor& xb) { return bias_gelu_forward(xb, b32); })
        .view(x.shape());
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("bias_gelu", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *b = bias.data<T>();
    T* py = y.data<T>();
    int64_t rows = C ? x.numel() / C : 0;
    parallel_for(0, rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if constexpr (std::is_same_v<T, float>)
          simd::gelu_row(px + r * C, b, py + r * C, C);
        else
          for (int64_t c = 0; c < C; ++c) py[r * C + c] = kernels::gelu_tanh(T(px[r * C + c] + b[c]));
      }
    });
  });
  return y;
}

BiasGeluBackward bias_gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& bias) {
  int64_t C = check_bias_gelu("bias_gelu_backward", x, bias);
  check_shaped_like("bias_gelu_backward", "dy", dy, x.shape(), x);
  if (!x.device().is_cpu()) return bias_gelu_backward_device(x.device())(dy, x, bias);
  if (is_half(x.dtype())) {  // f32 a block of rows at a time; dbias accumulates in f32
    Tensor b32 = upcast(bias);
    const int64_t rows = x.numel() / std::max<int64_t>(C, 1), block = half_block_rows(C);
    Tensor xr = x.contiguous().detach().view({rows, C}), dyr = dy.contiguous().detach().view({rows, C});
    BiasGeluBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::zeros({C}, DType::f32, x.device())};
    Tensor dxr = g.dx.detach().view({rows, C});
    float* db = g.dbias.data<float>();
    for (int64_t r = 0; r < rows; r += block) {
      int64_t n = std::min(block, rows - r);
      BiasGeluBackward part = bias_gelu_backward(upcast(dyr.narrow(0, r, n)), upcast(xr.narrow(0, r, n)), b32);
      Tensor dst = dxr.narrow(0, r, n);
      cast_into(part.dx, dst);
      const float* pdb = part.dbias.data<float>();
      for (int64_t c = 0; c < C; ++c) db[c] += pdb[c];
    }
    g.dbias = cast(g.dbias, x.dtype());
    return g;
  }
  BiasGeluBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::zeros({C}, x.dtype(), x.device())};
  dispatch_float("bias_gelu_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pdy = dy.data<T>(), *b = bias.data<T>();
    T* pdx = g.dx.data<T>();
    int64_t rows = C ? x.numel() / C : 0;
    int64_t blocks = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
    Tensor partials = Tensor::empty({blocks, C}, x.dtype(), x.device());  // each zeroed by the thread that fills it
    T* partial = partials.data<T>();
    parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        T* db = partial + k * C;
        std::fill(db, db + C, T(0));
        const int64_t r0 = k * kRowsPerPartial, r1 = std::min(rows, r0 + kRowsPerPartial);
        if constexpr (std::is_same_v<T, float>) {
          simd::gelu_backward_rows(pdy + r0 * C, px + r0 * C, b, pdx + r0 * C, db, r1 - r0, C);
          continue;
        }
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = 0; c < C; ++c) {
            T d = pdy[r * C + c] * kernels::gelu_tanh_grad(T(px[r * C + c] + b[c]));
            pdx[r * C + c] = d;
            db[c] += d;
          }
        }
      }
    });
    T* db = g.dbias.data<T>();
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t c = 0; c < C; ++c) db[c] += partial[k * C + c];
  });
  return g;
}

}  // namespace minidl::ops
