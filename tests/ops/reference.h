// Naive double-precision references for the basic ops tests: index arithmetic written out, no shortcuts.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace minidl::testing {

// Uniform values in [lo, hi) from Philox(seed), as a tensor of `dtype`.
inline Tensor uniform(const Shape& shape, uint64_t seed, DType dtype, double lo = -1.0, double hi = 1.0) {
  Philox rng(seed, 7);
  std::vector<double> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * rng.uniform(i);
  return Tensor::from_vector(v, shape, dtype);
}

// Row-major multi-index of flat position `flat` in `shape`.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(size_t(shape.size()));
  for (int d = shape.size() - 1; d >= 0; --d) {
    idx[size_t(d)] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

// Flat position in `shape` of the element that broadcasting maps out-index `idx` to.
inline int64_t broadcast_source(const std::vector<int64_t>& idx, const Shape& shape) {
  int lead = int(idx.size()) - shape.size();
  int64_t flat = 0;
  for (int d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : idx[size_t(d + lead)]);
  return flat;
}

// Expects f to throw minidl::Error whose message contains every one of `parts` (op name, shapes, dtypes).
inline void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace minidl::testing
