// Fused softmax + cross-entropy on the CPU, parallel over rows. Forward reads each row of logits once
// (simd::logsumexp_row: the exps against a guess of the max, the true max beside them); backward reads it once more
// and writes dlogits. f32 runs ops/cpu/simd's vector max and exp; f64 two scalar passes with std::exp.
// 16-bit logits are upcast to f32 first (the CPU reference of the CUDA kernels, which read them directly).
// Rows are V = classes long and Vp = logits.size(1) apart: padded columns are never read, and get zero gradients.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"
#include "ops/cross_entropy.h"

namespace minidl::ops {

// Throws naming the first target that is neither in [0, V) nor ignore_index; returns the number counted.
template <class I>
static int64_t count_targets(const I* t, int64_t N, int64_t V, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    int64_t v = int64_t(t[n]);
    if (v == ignore_index) continue;
    MINIDL_CHECK(v >= 0 && v < V, "cross_entropy: target ", v, " at row ", n,
                 " is out of range: expected 0 <= target < ", V,
                 " (the number of classes) or ignore_index = ", ignore_index);
    ++count;
  }
  return count;
}

int64_t cross_entropy_count_targets(const Tensor& targets, int64_t classes, int64_t ignore_index) {
  check_index("cross_entropy", "targets", targets);
  return dispatch_index(targets, [&](auto itag) {
    using I = decltype(itag);
    return count_targets(targets.data<I>(), targets.numel(), classes, ignore_index);
  });
}

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                          Reduction reduction, int64_t classes) {
  const int64_t V = check_cross_entropy(logits, targets, classes);
  if (!logits.device().is_cpu())
    return cross_entropy_forward_device(logits.device())(logits, targets, ignore_index, reduction, V);
  if (is_half(logits.dtype())) return cross_entropy_forward(upcast(logits), targets, ignore_index, reduction, V);
  const int64_t N = logits.size(0), Vp = logits.size(1);
  CrossEntropyForward f{Tensor::empty({}, logits.dtype(), logits.device()),
                        Tensor::empty({N}, logits.dtype(), logits.device()), 0};
  dispatch_float("cross_entropy", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets, [&](auto itag) {
      using I = decltype(itag);
      const I* t = targets.data<I>();
      f.count = count_targets(t, N, V, ignore_index);
      const T* x = logits.data<T>();
      T* lse = f.lse.data<T>();
      Tensor row_loss = Tensor::empty({N}, logits.dtype(), logits.device());
      T* loss = row_loss.data<T>();
      parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          const T* xr = x + n * Vp;
          if constexpr (std::is_same_v<T, float>) {
            lse[n] = simd::logsumexp_row(xr, V);
          } else {
            T m = -std::numeric_limits<T>::infinity(), sum = 0;
            for (int64_t j = 0; j < V; ++j) m = std::max(m, xr[j]);
            for (int64_t j = 0; j < V; ++j) sum += std::exp(xr[j] - m);
            lse[n] = m == -std::numeric_limits<T>::infinity() ? m : m + std::log(sum);  // a masked row: -inf
          }
          loss[n] = int64_t(t[n]) == ignore_index ? T(0) : lse[n] - xr[int64_t(t[n])];
        }
      });
      // Summed in row order by one thread: the loss does not depend on the thread count.
      double total = 0;
      for (int64_t n = 0; n < N; ++n) total += loss[n];
      f.loss.data<T>()[0] = T(reduction == Reduction::kSum ? total : total / double(f.count));
    });
  });
  return f;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t divisor, int64_t ignore_index, int64_t classes, bool overwrite_logits) {
  const int64_t V = check_cross_entropy(logits, targets, classes);
  const int64_t N = logits.size(0), Vp = logits.size(1);
  MINIDL_CHECK(dloss.defined() && dloss.numel() == 1, "cross_entropy_backward: expected a scalar dloss, got ",
               dloss.defined() ? dloss.shape() : Shape{});
  MINIDL_CHECK(lse.defined() && lse.shape() == Shape{N} && lse.device() == logits.device(),
               "cross_entropy_backward: expected lse of shape (", N, ") on ", logits.device(), ", got ",
               lse.defined() ? lse.shape() : Shape{});
  MINIDL_CHECK(dloss.device() == logits.device(), "cross_entropy_backward: expected dloss on ", logits.device(),
               ", got ", dloss.device());
  if (!logits.device().is_cpu())
    return cross_entropy_backward_device(logits.device())(dloss, logits, targets, lse, divisor, ignore_index, V,
                                                          overwrite_logits);
  if (is_half(logits.dtype()))
    return cast(cross_entropy_backward(dloss, upcast(logits), targets, lse, divisor, ignore_index, V), logits.dtype());
  check_shaped_like("cross_entropy_backward", "lse", lse, Shape{N}, logits);
  // In place, each element is read (in exp(x - lse)) before it is written.
  Tensor dlogits = overwrite_logits ? logits : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  dispatch_float("cross_entropy_backward", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets, [&](auto itag) {
      using I = decltype(itag);
      const I* t = targets.data<I>();
      const T *x = logits.data<T>(), *plse = lse.data<T>();
      T* dx = dlogits.data<T>();
      T scale = T(dloss.item() / double(divisor));
      parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          T* dr = dx + n * Vp;
          for (int64_t j = V; j < Vp; ++j) dr[j] = T(0);
          int64_t target = int64_t(t[n]);
          if (target == ignore_index) {
            for (int64_t j = 0; j < V; ++j) dr[j] = T(0);
            continue;
          }
          const T* xr = x + n * Vp;
          T l = plse[n];
          if constexpr (std::is_same_v<T, float>) {
            simd::exp_sub_scale(xr, l, scale, dr, V);
          } else {
            for (int64_t j = 0; j < V; ++j) dr[j] = std::exp(xr[j] - l) * scale;
          }
          dr[target] -= scale;
        }
      });
    });
  });
  return dlogits;
}

}  // namespace minidl::ops
