// Where a training window starts, shared bit for bit by the host sampler (data::BatchSampler), the CPU op and the
// CUDA kernel of ops/sample_windows.h.
//
// Sample `sample` of step `step` of a global batch of B windows of seq + 1 tokens over a split of len tokens starts
// at
//   offset = draw64 % (len - seq),   draw64 = (x << 32) | y of Philox(seed, stream).draw(step * B + sample)
// (unsigned 64-bit arithmetic throughout), so offset is in [0, len - seq - 1] and tokens[offset, offset + seq] fits.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/rng.h"

namespace minidl::ops::kernels {

// range = len - seq >= 1.
MINIDL_HD uint64_t window_start(const Philox& rng, uint64_t step, uint64_t global_batch, uint64_t sample,
                                uint64_t range) {
  const uint4x r = rng.draw(step * global_batch + sample);
  const uint64_t draw64 = (uint64_t(r.x) << 32) | r.y;
  return draw64 % range;
}

}  // namespace minidl::ops::kernels
