// Shape: a small inline vector of int64_t dimensions (at most kMaxDims), so building shapes in the training
// loop never touches the heap.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <vector>

#include "core/error.h"

namespace minidl {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  // Negative indices count from the back: back(-1) is the last dimension.
  int64_t back(int i = -1) const { return d_[n_ + i]; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  void push_back(int64_t v) {
    MINIDL_CHECK(n_ < kMaxDims, "shape: at most ", kMaxDims, " dimensions are supported");
    d_[n_++] = v;
  }
  void pop_back() { --n_; }
  int64_t numel() const {
    int64_t p = 1;
    for (int i = 0; i < n_; ++i) p *= d_[i];
    return p;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  bool operator==(const Shape& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  template <class It>
  void assign(It b, It e) {
    n_ = 0;
    for (; b != e; ++b) push_back(*b);
  }
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '(';
  for (int i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ',';
  return os << ')';
}

}  // namespace minidl
