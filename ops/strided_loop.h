// Internal to ops/: the one iteration helper under every elementwise kernel (a small TensorIterator).
//
// Visits a row-major index space `shape` over N operands of element type T, each with its own element strides
// (0 on broadcast dimensions). Dimensions that are contiguous in every operand are merged first, so a
// same-shape contiguous op becomes one flat loop and (B, T, C) + (C) becomes rows of C. The kernel is called
// once per innermost run:
//
//   strided_loop<T, 3>(shape, {out, a, b}, {out_strides, a_strides, b_strides}, /*parallel=*/true,
//                      [](const std::array<T*, 3>& p, const std::array<int64_t, 3>& inner_stride, int64_t n) {...});
//
// With parallel=true, runs are split over threads (by rows, or by chunks of a single flat run); the caller
// guarantees operand 0 (the output) is not written twice (no stride-0 output dimension).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/parallel.h"
#include "core/shape.h"

namespace minidl::ops::detail {

// Elements per thread below which splitting costs more than it saves.
inline constexpr int64_t kElementwiseGrain = 32768;

template <class T, size_t N, class Kernel>
void strided_loop(const Shape& shape, const std::array<T*, N>& base, const std::array<Shape, N>& strides, bool parallel,
                  const Kernel& kernel) {
  // Coalesce: drop size-1 dimensions, merge a dimension into the next when every operand steps through them
  // as one (stride[d] == stride[d+1] * size[d+1]).
  int64_t size[Shape::kMaxDims];
  int64_t stride[N][Shape::kMaxDims];
  int nd = 0;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = nd > 0;
    for (size_t k = 0; k < N && merge; ++k) merge = stride[k][nd - 1] == strides[k][d] * shape[d];
    if (merge) {
      size[nd - 1] *= shape[d];
      for (size_t k = 0; k < N; ++k) stride[k][nd - 1] = strides[k][d];
    } else {
      size[nd] = shape[d];
      for (size_t k = 0; k < N; ++k) stride[k][nd] = strides[k][d];
      ++nd;
    }
  }
  if (nd == 0) {  // a single element
    size[0] = 1;
    for (size_t k = 0; k < N; ++k) stride[k][0] = 0;
    nd = 1;
  }
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = stride[k][nd - 1];
  const int64_t inner = size[nd - 1];

  if (nd == 1) {  // one flat run: split it into chunks
    auto run = [&](int64_t b, int64_t e) {
      std::array<T*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = base[k] + b * inner_stride[k];
      kernel(p, inner_stride, e - b);
    };
    if (parallel)
      parallel_for(0, inner, kElementwiseGrain, run);
    else
      run(0, inner);
    return;
  }

  int64_t rows = 1;
  for (int d = 0; d < nd - 1; ++d) rows *= size[d];
  auto run_rows = [&](int64_t r0, int64_t r1) {
    int64_t idx[Shape::kMaxDims];
    std::array<T*, N> p = base;
    int64_t rem = r0;
    for (int d = nd - 2; d >= 0; --d) {  // decompose r0 into outer indices
      idx[d] = rem % size[d];
      rem /= size[d];
      for (size_t k = 0; k < N; ++k) p[k] += idx[d] * stride[k][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      kernel(p, inner_stride, inner);
      for (int d = nd - 2; d >= 0; --d) {  // advance the outer index with carry
        for (size_t k = 0; k < N; ++k) p[k] += stride[k][d];
        if (++idx[d] < size[d]) break;
        for (size_t k = 0; k < N; ++k) p[k] -= stride[k][d] * size[d];
        idx[d] = 0;
      }
    }
  };
  if (parallel)
    parallel_for(0, rows, std::max<int64_t>(1, kElementwiseGrain / inner), run_rows);
  else
    run_rows(0, rows);
}

}  // namespace minidl::ops::detail
