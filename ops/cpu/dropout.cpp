// Dropout on the CPU: one Philox draw per eight elements (ops/kernels/dropout.h), parallel over groups of eight; f32
// runs the draws as vector code (ops/cpu/simd/dropout.cpp), f64 the scalar reference.
#include <algorithm>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/dropout.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/dropout.h"

namespace minidl::ops {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset) {
  return dropout(x, p, seed, stream, offset, DropoutStep{});
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset, const DropoutStep& step) {
  check_dropout(x, p, step);
  if (is_half(x.dtype())) return cast(dropout(upcast(x), p, seed, stream, offset, step), x.dtype());
  if (!x.device().is_cpu()) return dropout_device(x.device())(x, p, seed, stream, offset, step);
  if (step.step.defined()) offset += uint64_t(step.step.contiguous().data<int64_t>()[0]) * step.offset_per_step;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float("dropout", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    constexpr int64_t kPer = kernels::kDropoutPerDraw;
    int64_t n = x.numel(), groups = (n + kPer - 1) / kPer;
    Philox rng(seed, stream);
    const uint32_t threshold = kernels::dropout_threshold(float(p));
    T scale = T(1) / (T(1) - T(p));
    parallel_for(0, groups, 512, [&](int64_t g0, int64_t g1) {
      if constexpr (std::is_same_v<T, float>) {
        simd::dropout_draws(px, py, n, uint64_t(g0), uint64_t(g1), seed, stream, offset, threshold, scale);
        return;
      }
      for (int64_t g = g0; g < g1; ++g) {
        bool keep[kPer];
        kernels::dropout_keep8(rng, offset, uint64_t(g), threshold, keep);
        for (int64_t i = kPer * g, e = std::min(n, i + kPer); i < e; ++i)
          py[i] = keep[i - kPer * g] ? px[i] * scale : T(0);
      }
    });
  });
  return y;
}

}  // namespace minidl::ops
