// Topology: the grid of ranks for data (dp), context (cp), tensor (tp) and pipeline (pp) parallelism, and the
// process groups along each axis. Built once, passed explicitly (no globals), so a test can build several.
//
//   dist::Topology topo(ctx.world(), {.dp = 2, .tp = 2, .pp = 1}, "ring");   // needs a world of 4 ranks
//   dist::Topology gpu(ctx.world(), {.dp = 4}, "nccl", Device::cuda(ctx.local_rank()));  // groups on a GPU
//   topo.coord();                                                           // {dp, tp, pp} of this rank
//   topo.dp_group().all_reduce(grads, dist::ReduceOp::kAvg)->wait();        // among ranks with my (tp, pp)
//
// Rank layout (Megatron-LM's convention, tp-cp-dp-pp): tp varies fastest, then cp, then dp, then pp:
//       rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank
// so a tensor-parallel group is tp consecutive ranks, which a launcher places on one host, where the bandwidth
// that tensor parallelism's per-layer all-reduces need is; a context-parallel group, whose ring sends every
// layer's keys and values, comes next (within the host while tp · cp ranks fit on one); pipeline stages, which
// talk least, are furthest apart.
// With dp = 2, tp = 2, pp = 1: tp groups {0,1} {2,3}; dp groups {0,2} {1,3}; pp groups {0} {1} {2} {3}.
// With dp = 2, cp = 2: cp groups {0,1} {2,3}; one dp group {0,1,2,3} (below).
//
// Context parallelism (dist/context_parallel.h) splits each sequence over the cp group: its ranks hold the same
// parameters and see the same samples, each its own positions. Their gradients are of different tokens, so they
// are averaged with the data-parallel ones: dp_group() is the dp × cp ranks of one (tp, pp) (Megatron's
// data-parallel group "with context parallel"), and DDP, ZeRO's shards, the loss average and the checkpoint's
// writers all run over it. The sampler's slice is the dp coordinate alone (every cp rank of it draws the same).
//
// Two more groups, for what later parallel modes combine:
// - the embedding group: the first and the last pipeline stage of one (dp, tp) pair (both hold the tied token
//   embedding, whose gradient they all-reduce); with pp = 1 it is the rank alone; middle stages have none;
// - the model-parallel group: every rank of one dp replica (tp · pp ranks), over which the gradient norm and the
//   fp16 overflow flag are combined (each logical parameter counted once).
// - the replica group (local SGD and DiLoCo, dist/local_sgd.h): with replicas R > 1 the world is R copies of the
//   dp × cp × tp × pp grid, numbered outermost (rank = replica · dp·cp·tp·pp + the grid's rank), every other
//   group inside one replica; the replica group joins the ranks at the same (dp, cp, tp, pp) in every replica, on
//   the host.
// This is the only place that reads world ranks: everything above it (the sampler slice, dropout offsets, DDP,
// the loss average) uses a coordinate and a group.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dist/process_group.h"

namespace minidl::dist {

struct GridCoord {
  int dp = 0, tp = 0, pp = 0, replica = 0, cp = 0;
  bool operator==(const GridCoord&) const = default;
};

// The sizes of the four axes (and the replicas of the whole grid); a pure value (no MPI), so the mapping is testable
// anywhere.
struct Grid {
  int dp = 1, tp = 1, pp = 1, replicas = 1, cp = 1;
  int ep = 1;  // expert parallelism: a divisor of dp · cp splitting the dp group (not an axis of its own: below)
  int size() const { return dp * cp * tp * pp * replicas; }
  GridCoord coord_of(int rank) const;
  int rank_of(const GridCoord& coord) const;
  // Throws naming the sizes unless each is >= 1 and dp · cp · tp · pp · replicas == world_size.
  void check_world(int world_size) const;
};

class Topology {
 public:
  // Collective over `world`: splits it into the sub-communicators and makes a process group of `backend`
  // ("mpi", "ring" or "nccl", see make_process_group) serving `device` on each. Throws on every rank if the grid
  // does not match the world size.
  Topology(MPI_Comm world, Grid grid, const std::string& backend, std::optional<Device> device = std::nullopt);
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const Grid& grid() const { return grid_; }
  int rank() const { return rank_; }
  const GridCoord& coord() const { return coord_; }
  // The ranks that differ from this one only in dp_rank and cp_rank (the gradients' group: above), ranked
  // dp_rank · cp + cp_rank; only in cp_rank (resp. tp_rank, pp_rank), whose rank is that coordinate.
  ProcessGroup& dp_group() const { return *dp_group_; }
  ProcessGroup& cp_group() const { return *cp_group_; }
  ProcessGroup& tp_group() const { return *tp_group_; }
  ProcessGroup& pp_group() const { return *pp_group_; }
  // Null on a middle pipeline stage.
  ProcessGroup* embedding_group() const { return embedding_group_.get(); }
  ProcessGroup& model_parallel_group() const { return *model_parallel_group_; }
  // Expert parallelism (dist/expert_parallel.h) cuts the dp group into groups of ep consecutive ranks, which share
  // out a mixture of experts' experts: ep_group() is this rank's (ranked dp group rank % ep); expert_dp_group() joins
  // the ranks holding the same experts, one per ep group (ranked dp group rank / ep), over which their gradients
  // average. With ep = 1: the rank alone, and the dp group's ranks.
  ProcessGroup& ep_group() const { return *ep_group_; }
  ProcessGroup& expert_dp_group() const { return *expert_dp_group_; }
  // The ranks at this rank's (dp, cp, tp, pp) in every replica, serving the host ("mpi", or "ring" when that is the
  // backend); the rank alone when replicas = 1.
  ProcessGroup& replica_group() const { return *replica_group_; }
  const std::string& backend() const { return backend_; }
  Device device() const { return dp_group_->device(); }
  bool first_stage() const { return coord_.pp == 0; }
  bool last_stage() const { return coord_.pp == grid_.pp - 1; }

 private:
  Grid grid_;
  int rank_ = 0;
  GridCoord coord_;
  std::string backend_;
  std::unique_ptr<ProcessGroup> dp_group_, cp_group_, tp_group_, pp_group_, embedding_group_, model_parallel_group_,
      replica_group_, ep_group_, expert_dp_group_;
};

}  // namespace minidl::dist
