// The reduction arithmetic of the collectives, for every dtype, in one place: what the ring adds when a slice
// arrives and how kAvg finishes. Kernels trust their input (the ProcessGroup entry points validated it).
//
//   reduce_into(DType::f32, ReduceOp::kSum, dst, src, n);   // dst[i] = dst[i] + src[i]
//   divide_by(DType::f32, dst, n, world);                   // dst[i] = dst[i] / world   (kAvg's last step)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "dist/process_group.h"

namespace minidl::dist {

// dst[i] = op(dst[i], src[i]) for i < count, where op is + for kSum and kAvg (the division comes once, at the end,
// from divide_by) and max for kMax. dtype: f32, f64, i32, i64, u8 (f16/bf16 reductions are staged through f32).
// The buffers must not overlap. The loops are plain and contiguous so the compiler vectorises them.
void reduce_into(DType dtype, ReduceOp op, void* dst, const void* src, int64_t count);

// data[i] = data[i] / divisor: true division for floating dtypes, truncating division for integers.
void divide_by(DType dtype, void* data, int64_t count, int divisor);

}  // namespace minidl::dist
