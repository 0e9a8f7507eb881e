// The reduction arithmetic of the collectives, for every dtype, in one place: what the ring adds when a slice
// arrives and how kAvg finishes. Kernels trust their input (the ProcessGroup entry points validated it).
//
//   reduce_into(DType::f32, ReduceOp::kSum, dst, src, n);   // dst[i] = dst[i] + src[i]
//   divide_by(DType::f32, dst, n, world);                   // dst[i] = dst[i] / world   (kAvg's last step)
//   reduce_into(dst_slice, src_slice, ReduceOp::kMax);      // the same on tensors, on the CPU or a CUDA device
//
// On a CUDA device the tensor forms run the kernels that the CUDA backend registers in the tables below
// (dist/cuda/reduce.cu, from minidl::cuda::register_dist()), on the device's compute stream.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "dist/process_group.h"
#include "ops/device_kernel.h"

namespace minidl::dist {

// dst[i] = op(dst[i], src[i]) for i < count, where op is + for kSum and kAvg (the division comes once, at the end,
// from divide_by) and max for kMax. dtype: f32, f64, i32, i64, u8; and sums of f16/bf16, each element added in f32
// and rounded back (ProcessGroup::all_reduce_16bit's hops; its all_reduce stages them through f32 instead). On a
// device only the first five. The buffers must not overlap. The loops are plain and contiguous so the compiler
// vectorises them.
void reduce_into(DType dtype, ReduceOp op, void* dst, const void* src, int64_t count);

// data[i] = data[i] / divisor: true division for floating dtypes, truncating division for integers.
void divide_by(DType dtype, void* data, int64_t count, int divisor);

// Tensor forms: contiguous tensors on one device, with the same dtype (from the list above) and element count.
// `dst` / `data` are written in place.
void reduce_into(Tensor& dst, const Tensor& src, ReduceOp op);
void divide_by(Tensor& data, int divisor);
// dst = src converted to dst's dtype (on a device: f32 <-> f16/bf16, or the same dtype); same element count.
void convert_into(Tensor& dst, const Tensor& src);

inline ops::DeviceKernel<void(Tensor& dst, const Tensor& src, ReduceOp op)> reduce_into_device{"dist::reduce_into"};
inline ops::DeviceKernel<void(Tensor& data, int divisor)> divide_by_device{"dist::divide_by"};
inline ops::DeviceKernel<void(Tensor& dst, const Tensor& src)> convert_into_device{"dist::convert_into"};

}  // namespace minidl::dist
