// conv2d on the CPU: im2col + one GEMM per image, parallel over images (each thread calls single-threaded BLAS
// on its own images, as in ops/matmul.cpp). NHWC makes im2col cheap: each (r, s) tap of an output pixel copies
// C contiguous input channels into the column matrix.
//
// For image n, with col (P*Q, R*S*C) its column matrix and weight viewed as (K, R*S*C):
//   y_n   = col . weight^T + bias      (P*Q, K)
//   dW   += dy_n^T . col               (K, R*S*C)
//   dcol  = dy_n . weight              (P*Q, R*S*C), scattered back into dx_n by col2im
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "ops/conv.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

namespace {

// dweight/dbias partial sums cover this many images each, then the partials are added in order: the result does
// not depend on the thread count.
constexpr int64_t kImagesPerPartial = 8;

CBLAS_TRANSPOSE flag(bool t) { return t ? CblasTrans : CblasNoTrans; }

// Row-major C = op(A) op(B) + beta C; op(A): (M, K), op(B): (K, N).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float beta, float* C) {
  cblas_sgemm(CblasRowMajor, flag(ta), flag(tb), int(M), int(N), int(K), 1.0f, A, int(ta ? M : K), B, int(tb ? K : N),
              beta, C, int(N));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, const double* B, double beta, double* C) {
  cblas_dgemm(CblasRowMajor, flag(ta), flag(tb), int(M), int(N), int(K), 1.0, A, int(ta ? M : K), B, int(tb ? K : N),
              beta, C, int(N));
}

// A 1x1 convolution with stride 1 and no padding reads the image itself as its column matrix.
bool is_pointwise(const ConvGeometry& g) { return g.R == 1 && g.S == 1 && g.stride == 1 && g.pad == 0; }

int64_t col_cols(const ConvGeometry& g) { return g.R * g.S * g.C; }

// col (P*Q, R*S*C) from one image (H, W, C); taps that fall in the padding are zeros.
template <class T>
void im2col(const ConvGeometry& g, const T* x, T* col) {
  for (int64_t p = 0; p < g.P; ++p)
    for (int64_t q = 0; q < g.Q; ++q)
      for (int64_t r = 0; r < g.R; ++r) {
        int64_t h = p * g.stride - g.pad + r * g.dil;
        for (int64_t s = 0; s < g.S; ++s, col += g.C) {
          int64_t w = q * g.stride - g.pad + s * g.dil;
          if (h < 0 || h >= g.H || w < 0 || w >= g.W)
            std::fill(col, col + g.C, T(0));
          else if (g.C == 1)  // the input layer's one channel: a memcpy call per tap costs more than the copy
            *col = x[h * g.W + w];
          else
            std::memcpy(col, x + (h * g.W + w) * g.C, size_t(g.C) * sizeof(T));
        }
      }
}

// dx (H, W, C) += the taps of dcol (P*Q, R*S*C) that fall inside the image.
template <class T>
void col2im(const ConvGeometry& g, const T* dcol, T* dx) {
  for (int64_t p = 0; p < g.P; ++p)
    for (int64_t q = 0; q < g.Q; ++q)
      for (int64_t r = 0; r < g.R; ++r) {
        int64_t h = p * g.stride - g.pad + r * g.dil;
        for (int64_t s = 0; s < g.S; ++s, dcol += g.C) {
          int64_t w = q * g.stride - g.pad + s * g.dil;
          if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
          T* d = dx + (h * g.W + w) * g.C;
          for (int64_t c = 0; c < g.C; ++c) d[c] += dcol[c];
        }
      }
}

// Threads for `items` independent pieces of work: one inside another parallel region.
int threads_for(int64_t items) {
  if (in_parallel_region()) return 1;
  return int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), items)));
}

template <class T>
void forward(const ConvGeometry& g, const T* x, const T* w, const T* b, T* y) {
  const int64_t PQ = g.P * g.Q, RSC = col_cols(g), image = g.H * g.W * g.C;
  const bool pointwise = is_pointwise(g);
  const int threads = threads_for(g.N);
  std::vector<T> cols(pointwise ? 0 : size_t(threads * PQ * RSC));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < g.N; ++n) {
    const T* col = x + n * image;
    if (!pointwise) {
      T* own = cols.data() + omp_get_thread_num() * PQ * RSC;
      im2col(g, x + n * image, own);
      col = own;
    }
    T* yn = y + n * PQ * g.K;
    if (b)
      for (int64_t i = 0; i < PQ; ++i) std::copy(b, b + g.K, yn + i * g.K);
    gemm(false, true, PQ, g.K, RSC, col, w, T(b ? 1 : 0), yn);
  }
}

template <class T>
void backward(const ConvGeometry& g, const T* dy, const T* x, const T* w, T* dx, T* dw, T* db) {
  const int64_t PQ = g.P * g.Q, RSC = col_cols(g), image = g.H * g.W * g.C, KRSC = g.K * RSC;
  const bool pointwise = is_pointwise(g);
  const int64_t blocks = (g.N + kImagesPerPartial - 1) / kImagesPerPartial;
  const int threads = threads_for(blocks);
  const size_t per_thread = pointwise ? 0 : size_t((dx ? 2 : 1) * PQ * RSC);  // col (+ dcol)
  std::vector<T> scratch(size_t(threads) * per_thread);
  // Block 0 accumulates straight into dw/db, block k > 0 into partial k - 1.
  std::vector<T> partials(size_t(std::max<int64_t>(0, blocks - 1) * (KRSC + g.K)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < blocks; ++k) {
    T* own = scratch.data() + omp_get_thread_num() * per_thread;
    T* dwk = k == 0 ? dw : partials.data() + (k - 1) * (KRSC + g.K);
    T* dbk = k == 0 ? db : dwk + KRSC;
    std::fill(dbk, dbk + g.K, T(0));
    for (int64_t n = k * kImagesPerPartial, n1 = std::min(g.N, n + kImagesPerPartial); n < n1; ++n) {
      const T* dyn = dy + n * PQ * g.K;
      const T* col = x + n * image;
      if (!pointwise) {
        im2col(g, x + n * image, own);
        col = own;
      }
      gemm(true, false, g.K, RSC, PQ, dyn, col, T(n == k * kImagesPerPartial ? 0 : 1), dwk);
      for (int64_t i = 0; i < PQ; ++i)
        for (int64_t o = 0; o < g.K; ++o) dbk[o] += dyn[i * g.K + o];
      if (!dx) continue;
      T* dxn = dx + n * image;
      if (pointwise) {
        gemm(false, false, PQ, RSC, g.K, dyn, w, T(0), dxn);
      } else {
        T* dcol = own + PQ * RSC;
        gemm(false, false, PQ, RSC, g.K, dyn, w, T(0), dcol);
        std::fill(dxn, dxn + image, T(0));
        col2im(g, dcol, dxn);
      }
    }
  }
  for (int64_t k = 1; k < blocks; ++k) {
    const T* part = partials.data() + (k - 1) * (KRSC + g.K);
    for (int64_t i = 0; i < KRSC; ++i) dw[i] += part[i];
    for (int64_t o = 0; o < g.K; ++o) db[o] += part[KRSC + o];
  }
}

}  // namespace

void conv2d_forward_cpu(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y) {
  forward(g, x, w, b, y);
}
void conv2d_forward_cpu(const ConvGeometry& g, const double* x, const double* w, const double* b, double* y) {
  forward(g, x, w, b, y);
}
void conv2d_backward_cpu(const ConvGeometry& g, const float* dy, const float* x, const float* w, float* dx, float* dw,
                         float* db) {
  backward(g, dy, x, w, dx, dw, db);
}
void conv2d_backward_cpu(const ConvGeometry& g, const double* dy, const double* x, const double* w, double* dx,
                         double* dw, double* db) {
  backward(g, dy, x, w, dx, dw, db);
}

ConvGeometry check_conv2d(const char* op, const Tensor& x, const Tensor& weight, const Conv2dOptions& o) {
  check_float(op, "x", x);
  MINIDL_CHECK(x.dim() == 4, op, ": expected x of shape (N, H, W, C) (channels last), got ", x.shape());
  check_like(op, "weight", weight, x);
  MINIDL_CHECK(weight.dim() == 4, op,
               ": expected weight of shape (K, R, S, C) (filters, height, width, channels), got ", weight.shape());
  MINIDL_CHECK(weight.size(3) == x.size(3), op, ": weight ", weight.shape(), " has ", weight.size(3),
               " input channels but x ", x.shape(), " has ", x.size(3));
  MINIDL_CHECK(o.stride >= 1, op, ": expected stride >= 1, got ", o.stride);
  MINIDL_CHECK(o.padding >= 0, op, ": expected padding >= 0, got ", o.padding);
  MINIDL_CHECK(o.dilation >= 1, op, ": expected dilation >= 1, got ", o.dilation);
  ConvGeometry g{x.size(0),      x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(1),
                 weight.size(2), 0,         0,         o.stride,  o.padding,      o.dilation};
  MINIDL_CHECK(g.N > 0 && g.H > 0 && g.W > 0 && g.C > 0 && g.K > 0 && g.R > 0 && g.S > 0, op,
               ": expected non-empty x and weight, got ", x.shape(), " and ", weight.shape());
  int64_t span_h = g.dil * (g.R - 1) + 1, span_w = g.dil * (g.S - 1) + 1;
  MINIDL_CHECK(span_h <= g.H + 2 * g.pad && span_w <= g.W + 2 * g.pad, op, ": the ", g.R, "x", g.S,
               " kernel (dilation ", g.dil, ", spanning ", span_h, "x", span_w, ") does not fit the ", g.H, "x", g.W,
               " input with padding ", g.pad);
  g.P = (g.H + 2 * g.pad - span_h) / g.stride + 1;
  g.Q = (g.W + 2 * g.pad - span_w) / g.stride + 1;
  return g;
}

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  ConvGeometry g = check_conv2d("conv2d", x, weight, o);
  if (bias.defined()) check_shaped_like("conv2d", "bias", bias, Shape{g.K}, x);
  if (!x.device().is_cpu()) return conv2d_forward_device(x.device())(x, weight, bias, o);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.K}, x.dtype(), x.device());
  dispatch_float("conv2d", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(g, x.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr, y.data<T>());
  });
  return y;
}

Conv2dBackward conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dOptions& o,
                               bool need_dx) {
  ConvGeometry g = check_conv2d("conv2d_backward", x, weight, o);
  check_shaped_like("conv2d_backward", "dy", dy, Shape{g.N, g.P, g.Q, g.K}, x);
  if (!x.device().is_cpu()) return conv2d_backward_device(x.device())(dy, x, weight, o, need_dx);
  Conv2dBackward r{need_dx ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                   Tensor::empty(weight.shape(), x.dtype(), x.device()), Tensor::empty({g.K}, x.dtype(), x.device())};
  dispatch_float("conv2d_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(g, dy.data<T>(), x.data<T>(), weight.data<T>(), need_dx ? r.dx.data<T>() : nullptr, r.dweight.data<T>(),
                r.dbias.data<T>());
  });
  return r;
}

}  // namespace minidl::ops
