// Which ids fall in one rank's slice of a vocabulary split across a tensor-parallel group (dist/tensor_parallel.h),
// computed where the ids are: on a CUDA device one launch, so the vocabulary-parallel embedding and cross-entropy
// never copy the ids back to the host.
//
//   ops::VocabRange r = ops::vocab_range(ids, /*start=*/33, /*length=*/33, /*row_stride=*/0, /*ignore_index=*/-1);
//   // ids {5, 40, -1} -> index {0, 7, 0}, in_range {0, 1, 0}, counted {1, 1, 0}
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

// For ids: i32 or i64, contiguous, any shape (on a device: i64), each id in [0, V) or equal to ignore_index:
//   in_range (f32, ids' shape): 1 where id != ignore_index and start <= id < start + length, else 0;
//   index    (i64, ids' shape): i * row_stride + (id - start) where in_range, else 0 (i is the flat position): a
//            row of this rank's table (row_stride 0), or the flat position of a row's target column in an
//            (N, length) matrix (row_stride = length);
//   counted  (f32, ids' shape): 0 where id == ignore_index, else 1.
struct VocabRange {
  Tensor index, in_range, counted;
};
VocabRange vocab_range(const Tensor& ids, int64_t start, int64_t length, int64_t row_stride, int64_t ignore_index);

// The CUDA kernel (ops/cuda/tensor/vocab_range.cpp).
inline DeviceKernel<VocabRange(const Tensor&, int64_t, int64_t, int64_t, int64_t)> vocab_range_device{"vocab_range"};

}  // namespace minidl::ops
