// Launchers of ops/cuda/grad_norm.cu: the global gradient norm and the clip, on the device, for many tensors in
// few launches and with no host round trip (ops/grad_norm.h is the op on Tensors).
//
//   GradNormTensor list[] = {{g0, n0}, {g1, n1}};
//   float* sq;  double* partials;  // grad_norm_partials(list, 2) doubles
//   CUDA_CHECK(grad_norm_squared(list, 2, partials, sq, stream));     // *sq = sum of g*g, deterministic
//   CUDA_CHECK(clip_grads(list, 2, sq, /*max_norm=*/1.0, stream));    // g *= min(1, max / (sqrt(*sq) + 1e-6))
#pragma once

#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// One gradient: n contiguous floats.
struct GradNormTensor {
  float* data;
  int64_t n;
};

// Doubles of scratch that grad_norm_squared needs for its per-chunk partial sums.
int64_t grad_norm_partials(const GradNormTensor* tensors, int count);
// *norm_squared = the sum of the squares of every element of every tensor. Each chunk of 64 Ki elements is summed
// in f64 by one block, then one thread adds the chunks' sums in order: the same bits on every run and every GPU.
// `partials` holds grad_norm_partials(tensors, count) doubles.
cudaError_t grad_norm_squared(const GradNormTensor* tensors, int count, double* partials, float* norm_squared,
                              cudaStream_t stream);
// Every element *= the clip coefficient, computed by each thread from the device value *norm_squared as the CPU
// computes it (optim/clip.h): factor = max_norm / (sqrt(sq) + 1e-6), applied only when factor < 1.
cudaError_t clip_grads(const GradNormTensor* tensors, int count, const float* norm_squared, double max_norm,
                       cudaStream_t stream);

}  // namespace minidl::ops::cuda
