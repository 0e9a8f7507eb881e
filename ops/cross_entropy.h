// Fused softmax + cross-entropy over a vocabulary, without autograd.
//
//   auto fwd = ops::cross_entropy_forward(logits, targets, -1);   // logits: (N, V), targets: (N)
//   Tensor dlogits = ops::cross_entropy_backward(dloss, logits, targets, fwd.lse, fwd.count, -1);
//
// Forward computes each row's logsumexp in one pass and loss = mean (or sum) over counted rows of
// (lse - logit[target]); the (N, V) probabilities are never stored. Backward recomputes them from the saved lse
// and writes dlogits = (softmax - onehot) * dloss / divisor in one pass per row (divisor: count for the mean, 1 for
// the sum).
//
// The sum is what gradient accumulation needs: each micro-batch's summed loss times 1 / (tokens in the whole
// step) adds up to exactly the mean over the step, where a mean of per-micro-batch means would weight micro-batches
// with fewer counted targets more.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

enum class Reduction { kMean, kSum };

struct CrossEntropyForward {
  Tensor loss;        // scalar (shape ()), logits' dtype; the mean is NaN if no row is counted (as PyTorch)
  Tensor lse;         // (N) logsumexp of each row, logits' dtype
  int64_t count = 0;  // rows whose target != ignore_index (not counted, 0, for a sum of host-checked device targets)
};

// logits: (N, V) f32/f64; targets: (N) i32/i64, each in [0, V) or equal to ignore_index.
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                          Reduction reduction = Reduction::kMean);

// dloss: scalar gradient of the loss; lse: from the forward; divisor: the forward's count for the mean, 1 for the
// sum -> dlogits (N, V); ignored rows get zeros.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t divisor, int64_t ignore_index);

// ---- argument checks, shared by every backend's entry (target values are checked by the kernel, on the data) ----
// The CUDA kernels (ops/cuda/tensor/cross_entropy.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<CrossEntropyForward(const Tensor&, const Tensor&, int64_t, Reduction)> cross_entropy_forward_device{
    "cross_entropy"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t)>
    cross_entropy_backward_device{"cross_entropy_backward"};

// Checks every target of a CPU index tensor (in [0, classes) or ignore_index) and returns how many are counted.
int64_t cross_entropy_count_targets(const Tensor& targets, int64_t classes, int64_t ignore_index);

inline void check_cross_entropy(const Tensor& logits, const Tensor& targets) {
  check_float("cross_entropy", "logits", logits);
  MINIDL_CHECK(logits.dim() == 2 && logits.size(1) > 0,
               "cross_entropy: expected logits of shape (N, V) with V > 0, got ", logits.shape());
  check_index("cross_entropy", "targets", targets);
  MINIDL_CHECK(targets.shape() == Shape{logits.size(0)}, "cross_entropy: expected targets of shape (",
               logits.size(0), ",) to match logits ", logits.shape(), ", got ", targets.shape());
}

}  // namespace minidl::ops
