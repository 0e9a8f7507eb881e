// Host-to-device uploads that do not make the host wait: a training batch goes to the device through page-locked
// staging memory on the compute stream, so a steady-state step makes no host synchronisation for it.
//
//   Tensor ids = Tensor::empty(batch.x.shape(), DType::i64, device);
//   upload_async(ids, ops::cast(batch.x, DType::i64));   // returns before the copy is done; batch.x is free again
#pragma once

#include "core/tensor.h"

namespace minidl {

// Copies the contiguous host tensor `src` into the contiguous device tensor `dst` of the same shape and dtype,
// ordered on dst's device's compute stream. `src` may be changed or freed as soon as this returns. Counted as one
// host-to-device copy of src.nbytes() (core/cuda/cuda.h: cuda::counters()), and as a host synchronisation only
// when the backend had to wait for a staging buffer (core/device_backend.h: DeviceBackend::upload_async).
void upload_async(const Tensor& dst, const Tensor& src);

// A new device tensor holding `src` (a host tensor, made contiguous): Tensor::empty on `device` + upload_async.
Tensor upload_async(const Tensor& src, Device device);

}  // namespace minidl
