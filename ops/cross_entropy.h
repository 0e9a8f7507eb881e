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
// A padded vocabulary (nn::GPTConfig::vocab_pad): logits may have more columns than there are classes. With
// classes = V < logits.size(1) = Vp, columns [V, Vp) are padding: they never enter the softmax (the lse is over the
// first V), targets must lie in [0, V), and backward writes 0 to their dlogits. classes = -1: every column is a class.
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
  Tensor loss;        // scalar (shape ()), logits' dtype (f32 for 16-bit logits); the mean is NaN if no row is
                      // counted (as PyTorch)
  Tensor lse;         // (N) logsumexp of each row, in the loss's dtype
  int64_t count = 0;  // rows whose target != ignore_index (not counted, 0, for a sum of host-checked device targets)
};

// logits: (N, Vp) f32/f64 (CUDA: f32/bf16/f16, f32 math and an f32 lse and loss); targets: (N) i32/i64, each in
// [0, V) or equal to ignore_index, V = classes (-1: Vp).
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                          Reduction reduction = Reduction::kMean, int64_t classes = -1);

// dloss: scalar gradient of the loss; lse: from the forward; divisor: the forward's count for the mean, 1 for the
// sum -> dlogits (N, Vp) in the logits' dtype; ignored rows and padded columns get zeros.
// overwrite_logits: the caller lets dlogits be written over the logits (whose values are dead after this call, as
// llm.c does with its fused classifier): no second (N, Vp) buffer. A permission, not a promise: the returned
// tensor is dlogits either way, and the logits must not be read again.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t divisor, int64_t ignore_index, int64_t classes = -1,
                              bool overwrite_logits = false);

// ---- argument checks, shared by every backend's entry (target values are checked by the kernel, on the data) ----
// The CUDA kernels (ops/cuda/tensor/cross_entropy.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<CrossEntropyForward(const Tensor&, const Tensor&, int64_t, Reduction, int64_t)>
    cross_entropy_forward_device{"cross_entropy"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t, bool)>
    cross_entropy_backward_device{"cross_entropy_backward"};

// Checks every target of a CPU index tensor (in [0, classes) or ignore_index) and returns how many are counted.
int64_t cross_entropy_count_targets(const Tensor& targets, int64_t classes, int64_t ignore_index);

// Returns the number of classes (classes, or every column for -1).
inline int64_t check_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t classes = -1) {
  check_float_or_half("cross_entropy", "logits", logits);
  MINIDL_CHECK(logits.dim() == 2 && logits.size(1) > 0,
               "cross_entropy: expected logits of shape (N, V) with V > 0, got ", logits.shape());
  MINIDL_CHECK(classes == -1 || (classes > 0 && classes <= logits.size(1)), "cross_entropy: expected classes in [1, ",
               logits.size(1), "] (the logits' columns) or -1 (all), got ", classes);
  check_index("cross_entropy", "targets", targets);
  MINIDL_CHECK(targets.shape() == Shape{logits.size(0)}, "cross_entropy: expected targets of shape (", logits.size(0),
               ",) to match logits ", logits.shape(), ", got ", targets.shape());
  return classes == -1 ? logits.size(1) : classes;
}

}  // namespace minidl::ops
