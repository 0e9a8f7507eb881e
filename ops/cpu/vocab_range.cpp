// vocab_range on the CPU: the plain loop the CUDA kernel is held to.
#include "ops/vocab_range.h"

#include <type_traits>

#include "ops/nn_checks.h"

namespace minidl::ops {

VocabRange vocab_range(const Tensor& ids, int64_t start, int64_t length, int64_t row_stride, int64_t ignore_index) {
  MINIDL_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
               "vocab_range: expected ids of dtype i32 or i64, got ", ids.dtype());
  MINIDL_CHECK(ids.device().is_cpu() || ids.dtype() == DType::i64, "vocab_range: expected i64 ids on ", ids.device(),
               ", got ", ids.dtype());
  MINIDL_CHECK(start >= 0 && length > 0 && row_stride >= 0,
               "vocab_range: expected start >= 0, length > 0 and "
               "row_stride >= 0, got ",
               start, ", ", length, ", ", row_stride);
  check_contiguous("vocab_range", "ids", ids);
  if (!ids.device().is_cpu()) return vocab_range_device(ids.device())(ids, start, length, row_stride, ignore_index);
  VocabRange r{Tensor::empty(ids.shape(), DType::i64), Tensor::empty(ids.shape(), DType::f32),
               Tensor::empty(ids.shape(), DType::f32)};
  int64_t* index = r.index.data<int64_t>();
  float* in_range = r.in_range.data<float>();
  float* counted = r.counted.data<float>();
  dispatch_dtype(ids.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      const T* v = ids.data<T>();
      for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t id = int64_t(v[i]);
        const bool mine = id != ignore_index && id >= start && id < start + length;
        index[i] = mine ? i * row_stride + (id - start) : 0;
        in_range[i] = mine ? 1.0f : 0.0f;
        counted[i] = id == ignore_index ? 0.0f : 1.0f;
      }
    }
  });
  return r;
}

}  // namespace minidl::ops
