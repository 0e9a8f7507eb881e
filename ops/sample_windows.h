// The training windows of one rank's slice of a global batch, gathered where the tokens are: on a CUDA device one
// launch writes ids and targets from a split uploaded once, so a training step copies nothing to the device for its
// batch (data::DeviceBatchSampler). Row r of the slice is sample begin + r of the global batch of `step`, the window
// data::BatchSampler draws (ops/kernels/sample_windows.h), bit for bit.
//
//   ops::WindowDraw d{seed, data::kSamplerStream, /*global_batch=*/64, /*step=*/s, Tensor(), /*begin=*/16};
//   ops::sample_windows_(tokens, /*seq=*/256, d, x, y);   // x, y: (16, 256) i64, overwritten
//
// Under a CUDA graph the step cannot be a kernel argument (a replay repeats the captured arguments): it may be read
// from device memory when the kernel runs instead (WindowDraw::step_on_device, as ops::DropoutStep does).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

struct WindowDraw {
  uint64_t seed = 0;
  uint64_t stream = 0;       // the Philox stream id (data::kSamplerStream)
  int64_t global_batch = 1;  // B: the draw of sample b of step s is step * B + b
  int64_t step = 0;          // used when step_on_device is undefined
  Tensor step_on_device;     // i64 {1} on the tokens' device, read when the op runs; undefined: `step`
  int64_t begin = 0;         // the slice's first sample
};

// tokens: (len) i32, contiguous, len >= seq + 1; x, y: (n, seq) i64, contiguous, on tokens' device, with
// 0 <= begin and begin + n <= global_batch. Row r: start = window_start(step, begin + r);
// x[r] = tokens[start, start + seq), y[r] = tokens[start + 1, start + seq + 1).
void sample_windows_(const Tensor& tokens, int64_t seq, const WindowDraw& draw, const Tensor& x, const Tensor& y);

// The CUDA kernel (ops/cuda/tensor/sample_windows.cpp).
inline DeviceKernel<void(const Tensor&, int64_t, const WindowDraw&, const Tensor&, const Tensor&)>
    sample_windows_device{"sample_windows"};

}  // namespace minidl::ops
