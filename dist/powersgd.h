// PowerSGD (Vogels et al. 2019; PyTorch's powerSGD_hook): DDP's bucket average sent as a rank-r approximation,
// with error feedback and a warm start.
//
//   dist::PowerSgd hook({.rank = 4, .start_iter = 30});
//   hook.bind(reducer.buckets(), reducer.params());        // which spans of a bucket are matrices
//   hook.reduce(group, b, buffer);                          // the bucket collective (DDPOptions::compression)
//
// Each parameter of at least 2 dimensions is a matrix M (n = its first dimension, m = the rest). One step, on rank k,
// with Q (m × r) kept from the last step (the warm start: Q starts as the same normal draws on every rank):
//
//   M_k ← g_k + e_k                     error feedback: what earlier steps left out is sent now
//   P   = Σ_k M_k Q                     one all-reduce of n·r values
//   P   ← orthonormal columns (Gram-Schmidt; a column the others span becomes 0)
//   Q   = (1/N) Σ_k M_kᵀ P              one all-reduce of m·r values
//   M̂   = P Qᵀ = P Pᵀ · mean_k M_k      the mean projected onto r directions: what every rank gets
//   e_k ← M_k − M̂                       kept for the next step
//
// so a matrix costs (n + m)·r values instead of n·m. One power iteration per step, warm-started, tracks the mean
// gradient's top-r subspace as it drifts. At r = min(n, m) the projection is the identity and M̂ is the exact mean.
// Error feedback makes the sum of what was sent telescope: Σ_t M̂_t + mean_k e_k = Σ_t mean_k g_k,t, so nothing is
// lost, only delayed. Vectors (biases, LayerNorms) and matrices that would not shrink by min_compression_rate go
// uncompressed, averaged in one f32 all-reduce (their error is then g_k − mean, added back the same way). The first
// start_iter steps of each bucket are plain f32 averages with no error kept (PyTorch's start_powerSGD_iter: the
// early gradients change too fast for a low-rank warm start).
//
// Memory per rank: e (the bucket's size) and Q (m·r a matrix). On the host, in f32; CPU buffers only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "dist/bucketing.h"
#include "dist/process_group.h"

namespace minidl::dist {

struct PowerSgdOptions {
  int rank = 4;                       // r
  int64_t start_iter = 0;             // plain averages for each bucket's first start_iter steps
  double min_compression_rate = 2.0;  // compress a matrix when n·m >= rate · (n + m)·r
  uint64_t seed = 0;                  // Q's first draws (the same on every rank)
};

class PowerSgd {
 public:
  explicit PowerSgd(PowerSgdOptions options);
  // The parameters of each bucket (a Reducer's buckets() and params()): which spans are matrices, their shapes.
  void bind(const std::vector<BucketSpec>& buckets, const std::vector<Tensor>& params);
  // The bucket collective: `buffer` (f32 on the CPU) = the compressed average. Blocking; collective over `group`.
  std::shared_ptr<Work> reduce(ProcessGroup& group, size_t bucket, Tensor& buffer);
  // This rank's error feedback of a bucket (empty before its first compressed step).
  const std::vector<float>& error(size_t bucket) const { return buckets_.at(bucket).error; }
  const PowerSgdOptions& options() const { return options_; }

 private:
  struct Matrix {
    int64_t offset = 0, rows = 0, cols = 0, rank = 0;
    std::vector<float> q;  // cols × rank, row-major
  };
  struct Bucket {
    std::vector<Matrix> matrices;
    std::vector<std::pair<int64_t, int64_t>> rest;  // (offset, numel) of the spans sent whole
    std::vector<float> error;
    int64_t steps = 0;
  };
  PowerSgdOptions options_;
  std::vector<Bucket> buckets_;
};

}  // namespace minidl::dist
