// ops/vocab_range.h on CUDA devices: ops/cuda/vocab_range.cu through ops/cuda/vocab_range.h, i64 ids.
#include "ops/cuda/vocab_range.h"
#include "ops/cuda/tensor/register.h"
#include "ops/vocab_range.h"

namespace minidl::ops::cuda {
namespace {

VocabRange vocab_range_on_device(const Tensor& ids, int64_t start, int64_t length, int64_t row_stride,
                                 int64_t ignore_index) {
  const Device device = ids.device();
  OnDevice on(ids);
  VocabRange r{Tensor::empty(ids.shape(), DType::i64, device), Tensor::empty(ids.shape(), DType::f32, device),
               Tensor::empty(ids.shape(), DType::f32, device)};
  MINIDL_CUDA_CHECK(vocab_range(ids.device_data<int64_t>(), ids.numel(), start, length, row_stride, ignore_index,
                                r.index.device_data<int64_t>(), r.in_range.device_data<float>(),
                                r.counted.device_data<float>(), on.stream));
  return r;
}

void register_vocab_range() { vocab_range_device.set(DeviceKind::kCUDA, &vocab_range_on_device); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_vocab_range);

}  // namespace minidl::ops::cuda
