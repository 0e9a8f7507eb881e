// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_).
//
//   double norm = optim::clip_grad_norm(model.parameters(), /*max_norm=*/1.0);   // pre-clip norm, for logging
//
// It is two halves so that distributed code can combine partial norms in between: with sharded gradients (ZeRO)
// or parameters split across tensor/pipeline ranks, each rank computes grad_norm_squared over what it owns,
// all-reduces the sum, takes the square root and then calls scale_grads with the same factor on every rank:
//
//   double sq = optim::grad_norm_squared(my_params);  pg.all_reduce(sq);
//   double norm = std::sqrt(sq);
//   if (std::isfinite(norm) && norm > max_norm) optim::scale_grads(my_params, optim::clip_factor(norm, max_norm));
//
// Parameters without a gradient are skipped. Gradients must be contiguous f32 or f64.
//
// On a CUDA device the same two halves exist without a host round trip (train::apply_step uses them): the sum of
// squares stays a device tensor that the ranks all-reduce in place, and the clip kernel computes the factor from it:
//
//   Tensor sq = optim::grad_norm_squared_tensor(my_params, device);  pg.all_reduce(sq)->wait();
//   optim::clip_grads_by(my_params, sq, max_norm);                    // factor and scale on the device
#pragma once

#include <vector>

#include "core/tensor.h"

namespace minidl::optim {

// Sum of squares of every gradient element, accumulated in double. Deterministic: the summation order depends
// only on the gradient sizes, never on the number of threads.
double grad_norm_squared(const std::vector<Tensor>& params);
// Multiplies every gradient by factor, in place.
void scale_grads(const std::vector<Tensor>& params, double factor);
// max_norm / (norm + 1e-6): the factor PyTorch scales by (the epsilon guards a zero norm).
double clip_factor(double norm, double max_norm);

// The device form (f32 gradients): an f32 {1} tensor on `device` holding the sum of squares (accumulated in f64,
// ops/grad_norm.h); no synchronisation.
Tensor grad_norm_squared_tensor(const std::vector<Tensor>& params, Device device);
// Multiplies every gradient by clip_factor(sqrt(norm_squared), max_norm) when that is < 1, the factor computed on
// the device from the device value norm_squared (grad_norm_squared_tensor's, combined over ranks).
void clip_grads_by(const std::vector<Tensor>& params, const Tensor& norm_squared, double max_norm);

// Scales the gradients so their global norm is at most max_norm (> 0) and returns the norm before clipping.
// A non-finite norm (inf/nan gradients) is returned as is and the gradients are left alone: the caller (e.g. a
// loss scaler) decides whether to skip the step.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace minidl::optim
