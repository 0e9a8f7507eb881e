// Online softmax (Milakov & Gimelshein, 2018): a running max m and a running sum l = sum exp(x - m), updated one
// block of scores at a time, so a softmax (or a logsumexp) needs a single pass and never overflows exp.
// Shared by flash attention (CPU and CUDA) and the CUDA cross-entropy kernel.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace minidl::ops::kernels {

template <class T>
struct OnlineSoftmax {
  T max;  // running maximum of the scores seen (-inf before the first)
  T sum;  // sum of exp(score - max) over the scores seen

  // Folds in a block whose maximum is block_max. Returns the factor exp(old max - new max) by which everything
  // accumulated against the old maximum (sum here; the output rows in attention) must be rescaled. The caller
  // then adds exp(score - max) of the block's scores to sum.
  MINIDL_HD T rescale_for(T block_max) {
    T new_max = block_max > max ? block_max : max;
    // exp(-inf - finite) = 0 handles the first block without a branch on "empty"; equal maxima (both -inf while
    // only -inf scores were seen) must give 1, not exp(-inf + inf) = NaN.
    T factor = new_max == max ? T(1) : std::exp(max - new_max);
    max = new_max;
    sum *= factor;
    return factor;
  }

  MINIDL_HD T logsumexp() const { return max + std::log(sum); }
};

}  // namespace minidl::ops::kernels
