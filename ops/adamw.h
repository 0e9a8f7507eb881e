// Fused AdamW step over flat f32 buffers: one pass reads param, grad, m, v and writes param, m, v.
//
// The buffers are treated as flat arrays of numel() elements (any shape; all four must have the same numel and be
// contiguous f32 on the same device). optim::AdamW calls this once per parameter with that parameter's slice of its
// flat state; ZeRO calls it on a rank's shard. The math is kernels::adamw_element (ops/kernels/adamw.h).
//
//   ops::fused_adamw_(w, w.grad(), m, v, {.lr = 1e-3, .weight_decay = 0.1, .step = 1});
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // 1-based count including this step; drives the bias correction
  // fused_adamw_multi_unless_ only: defined (an f64 {1} tensor on the parameters' device), the learning rate is read
  // from it when the step runs instead of `lr`, so a step captured in a CUDA graph follows a schedule.
  Tensor lr_on_device{};
};

// Updates param, m and v in place (they are handles: the data changes, not the Tensor objects).
// The same step for many tensors with the same hyperparameters (a parameter group): element lists of equal
// length, each entry checked as above and all on one device. On a CUDA device the whole list is one
// multi-tensor kernel launch (or a few, for very long lists) instead of one per tensor. zero_grads: the grads are
// set to zero after the update (on the CPU in the same pass, sparing zero_grad's own pass over them).
void fused_adamw_multi_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        const std::vector<Tensor>& m, const std::vector<Tensor>& v, const AdamWHyper& h,
                        bool zero_grads = false);

// The same step unless found_inf (an i32 {1} flag on the parameters' device, e.g. GradScaler's) is set, as PyTorch's
// fused optimizers skip on found_inf: on a CUDA device the kernel reads the flag itself, so the host never learns
// whether the step ran. The bias correction then uses h.step - skipped (skipped: an i64 {1} count of the steps
// skipped so far on that device; h.step counts the calls, this one included). count_skip: a skipped step adds 1
// to skipped (true on the last of a step's calls, one per parameter group, so that each call reads the same count).
void fused_adamw_multi_unless_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& m, const std::vector<Tensor>& v, const AdamWHyper& h,
                               const Tensor& found_inf, const Tensor& skipped, bool count_skip);

// skipped += delta on skipped's device (an i64 {1} count as above), without the host reading it: what a step
// captured in a CUDA graph uses to count its replays (optim::AdamW::count_next_step_on_device).
void add_to_count_(const Tensor& skipped, int64_t delta);
inline DeviceKernel<void(const Tensor&, int64_t)> add_to_count_device{"add_to_count_"};

// The CUDA kernels (ops/cuda/tensor/adamw.cpp; the flagged one ops/cuda/tensor/device_step.cpp), filled by
// minidl::cuda::register_backend().
inline DeviceKernel<void(const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                         const std::vector<Tensor>&, const AdamWHyper&, const Tensor&, const Tensor&, bool)>
    fused_adamw_multi_unless_device{"fused_adamw_multi_unless_"};
inline DeviceKernel<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWHyper&)>
    fused_adamw_device{"fused_adamw_"};
inline DeviceKernel<void(const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                         const std::vector<Tensor>&, const AdamWHyper&)>
    fused_adamw_multi_device{"fused_adamw_multi_"};

void fused_adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& h);

}  // namespace minidl::ops
