// How a parameter held by this process lies in the one-process model: whole (the default), replicated over a group
// of ranks, or split along one dimension over it. The parameter carries its layout (set by the parallelism that
// placed it, read by checkpoints, gradient clipping, the memory ledger and the gradient synchronisation), so no
// caller asks what kind of model it holds.
//
//   nn::set_layout(w, layout);                  // dist/ does this when it splits w
//   const nn::ParamLayout l = nn::layout_of(w);  // whole, shaped like w, where nothing was set
//   Tensor mine = l.slice(whole_from_a_checkpoint);
//
// A split dimension `dim` is cut into `parts` equal parts (c_attn: 3, for q, k and v), each part into `ranks`
// slices of ceil(part / ranks); rank r holds slice r of every part, concatenated. Where a slice runs past the end
// of its part (a vocabulary of 65 at tp 2: 33 rows each, the second rank's last row past 65) the local rows are
// padding: zero, never read back into the whole parameter.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace minidl::dist {
class ProcessGroup;  // nn/ only carries it: dist/ gathers over it
}  // namespace minidl::dist

namespace minidl::nn {

struct ParamLayout {
  Shape full_shape;
  int dim = -1;  // the split dimension; -1: not split
  int64_t parts = 1;
  int ranks = 1, rank = 0;              // the group's size and this rank's place in it (1, 0: whole)
  dist::ProcessGroup* group = nullptr;  // what it is split or replicated over; null: whole
  bool sequence_sliced = false;         // replicated, but it acts on this rank's positions only (sequence
                                        // parallelism): its gradient is a partial sum over the group

  bool is_split() const { return dim >= 0 && ranks > 1; }
  bool is_replicated() const { return !is_split() && ranks > 1; }
  int64_t full_numel() const;
  // The shape of the local tensor.
  Shape local_shape() const;
  // The contiguous runs of the split dimension (split layouts only): local [local_start, local_start + length)
  // holds whole [full_start, full_start + length).
  struct Piece {
    int64_t full_start, local_start, length;
  };
  std::vector<Piece> pieces() const;
  // Local tensor (CPU) from the whole parameter: the pieces copied, padding zero (a copy of it when not split).
  Tensor slice(const Tensor& full) const;
  // Writes this rank's local tensor into the whole parameter `full` (the pieces only).
  void scatter_into(Tensor& full, const Tensor& local) const;
  // Fills local (f32, contiguous, CPU) with N(0, std^2) drawn as nn::init_normal(whole, std, seed, stream) draws
  // the whole parameter, so the split model starts from the one-process weights. Padding stays zero.
  void init_normal(Tensor& local, double std, uint64_t seed, uint64_t stream) const;
};

// p's layout: the one set on it, or whole with p's shape.
ParamLayout layout_of(const Tensor& p);
void set_layout(const Tensor& p, const ParamLayout& layout);

}  // namespace minidl::nn
