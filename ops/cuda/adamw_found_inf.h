// The launcher of ops/cuda/adamw.cu's fused AdamW that skips on the device's overflow flag, as PyTorch's fused
// optimizers do with found_inf: the host does not learn whether the step ran, so the step count that drives the
// bias correction lives on the device too (`step` counts the calls, `*skipped` the skipped ones).
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"
#include "ops/cuda/adamw.h"

namespace minidl::ops::cuda {

// The hyperparameters with the step count split between host and device. found_inf null: not in use.
struct AdamWDeviceStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t step = 0;                      // calls so far, this one included (1-based)
  const int* found_inf = nullptr;        // skip the step when *found_inf != 0
  int64_t* skipped = nullptr;            // steps skipped before this one
  bool count_skip = false;               // add 1 to *skipped when this one is skipped
  const double* lr_on_device = nullptr;  // non-null: the learning rate is read here, not `lr` (a CUDA graph's step)
};

// fused_adamw (ops/cuda/adamw.h) with the constants computed on the device from step - *skipped, skipped entirely when
// *found_inf, and then, with count_skip, *skipped incremented (one more single-thread launch).
cudaError_t fused_adamw_unless_found_inf(const AdamWTensor* tensors, int count, const AdamWDeviceStep& step,
                                         cudaStream_t stream);
// *count += delta, one thread (ops::add_to_count_).
cudaError_t add_to_count(int64_t* count, int64_t delta, cudaStream_t stream);

}  // namespace minidl::ops::cuda
