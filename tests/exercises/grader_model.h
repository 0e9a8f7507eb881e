// The graders' small model and data (tests/exercises/grade_*.cpp): every rank can build the one-process oracle.
//
//   exercises::model::Net model(kRankZeroSeed + rank), oracle(kRankZeroSeed);   // each rank its own init
//   auto [x, y] = batch(step);                                                   // the global batch of kRows
//   model.loss(slice(x, rank, size), slice(y, rank, size)).backward();           // this rank's rows' mean loss
//
// y = (gelu(gelu(x W + b) T) Tᵀ + frozen) P. With hard_cases (CS336's: the default), T is registered twice, as
// "wte" and as "lm_head" (one tensor, two names), "frozen" is a parameter that does not train, "unused" one the loss
// never reads, and "running" a buffer; without, only fc_weight, fc_bias, wte and proj are parameters.
#pragma once

#include <cstdint>
#include <utility>

#include "autograd/functions.h"
#include "core/rng.h"
#include "nn/module.h"

namespace minidl::exercises::model {

constexpr int64_t kRows = 12, kIn = 4, kHidden = 8, kOut = 2;
constexpr uint64_t kRankZeroSeed = 100;

inline Tensor normal(const Shape& shape, uint64_t seed, uint64_t stream, double scale) {
  return mul(Tensor::randn(shape, Philox(seed, stream)), scale).detach();
}

struct Net : nn::Module {
  explicit Net(uint64_t seed, bool hard_cases = true) {
    fc_weight = register_parameter("fc_weight", normal({kIn, kHidden}, seed, 1, 0.5));
    fc_bias = register_parameter("fc_bias", normal({kHidden}, seed, 2, 0.1));
    tied = register_parameter("wte", normal({kHidden, kHidden}, seed, 3, 0.4));
    frozen = normal({kHidden}, hard_cases ? seed : kRankZeroSeed, 4, 0.3);  // a constant unless a parameter
    if (hard_cases) {
      register_parameter("lm_head", tied);
      register_parameter("frozen", frozen).set_requires_grad(false);
      unused = register_parameter("unused", normal({3}, seed, 5, 1.0));
    }
    proj = register_parameter("proj", normal({kHidden, kOut}, seed, 6, 0.5));
    if (hard_cases) running = register_buffer("running", normal({kHidden}, seed, 7, 1.0));
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor h = gelu(matmul(gelu(add(matmul(x, fc_weight), fc_bias)), tied));
    Tensor out = matmul(add(matmul(h, tied, false, true), frozen), proj);
    return mean(square(sub(out, y)));
  }
  Tensor fc_weight, fc_bias, tied, frozen, unused, proj, running;
};

// The global batch of step `step`: kRows rows of x (kIn) and y (kOut).
inline std::pair<Tensor, Tensor> batch(int step) {
  return {normal({kRows, kIn}, 7, 100 + uint64_t(step), 1.0), normal({kRows, kOut}, 7, 200 + uint64_t(step), 1.0)};
}

// Rank `rank`'s rows of a global batch (kRows divides by 2, 3 and 4).
inline Tensor slice(const Tensor& t, int rank, int size) {
  const int64_t rows = kRows / size;
  return t.narrow(0, rank * rows, rows);
}

}  // namespace minidl::exercises::model
