#include "dist/topology.h"

#include "dist/init.h"

namespace minidl::dist {

GridCoord Grid::coord_of(int rank) const {
  MINIDL_CHECK(rank >= 0 && rank < size(), "Grid::coord_of: rank ", rank, " outside a grid of ", size());
  const int inside = rank % (dp * cp * tp * pp);
  return {.dp = (inside / (tp * cp)) % dp,
          .tp = inside % tp,
          .pp = inside / (tp * cp * dp),
          .replica = rank / (dp * cp * tp * pp),
          .cp = (inside / tp) % cp};
}

int Grid::rank_of(const GridCoord& c) const {
  MINIDL_CHECK(c.dp >= 0 && c.dp < dp && c.tp >= 0 && c.tp < tp && c.pp >= 0 && c.pp < pp && c.replica >= 0 &&
                   c.replica < replicas && c.cp >= 0 && c.cp < cp,
               "Grid::rank_of: (dp ", c.dp, ", cp ", c.cp, ", tp ", c.tp, ", pp ", c.pp, ", replica ", c.replica,
               ") outside a grid of dp ", dp, " × cp ", cp, " × tp ", tp, " × pp ", pp, " × ", replicas, " replicas");
  return (((c.replica * pp + c.pp) * dp + c.dp) * cp + c.cp) * tp + c.tp;
}

void Grid::check_world(int world_size) const {
  MINIDL_CHECK(ep >= 1 && (dp * cp) % ep == 0, "Topology: ep ", ep, " must divide the dp group's ", dp * cp, " ranks");
  MINIDL_CHECK(dp >= 1 && cp >= 1 && tp >= 1 && pp >= 1 && replicas >= 1,
               "Topology: dp, cp, tp, pp and replicas must each be at least 1, got dp ", dp, ", cp ", cp, ", tp ", tp,
               ", pp ", pp, ", replicas ", replicas);
  MINIDL_CHECK(size() == world_size, "Topology: dp × ", cp > 1 ? "cp × " : "", "tp × pp = ", dp, " × ",
               cp > 1 ? std::to_string(cp) + " × " : std::string(), tp, " × ", pp,
               replicas > 1 ? " times " + std::to_string(replicas) + " replicas" : std::string(), " = ", size(),
               " does not match the world size ", world_size);
}

namespace {

// A process group over the ranks that share `color`, ordered by `key`; null for MPI_UNDEFINED.
std::unique_ptr<ProcessGroup> split_group(MPI_Comm world, int color, int key, const std::string& backend,
                                          std::optional<Device> device) {
  MPI_Comm sub;
  MINIDL_MPI_CHECK(MPI_Comm_split(world, color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  std::unique_ptr<ProcessGroup> group;
  try {
    group = make_process_group(backend, sub, device);  // duplicates `sub`
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MINIDL_MPI_CHECK(MPI_Comm_free(&sub));
  return group;
}

}  // namespace

Topology::Topology(MPI_Comm world, Grid grid, const std::string& backend, std::optional<Device> device)
    : grid_(grid), backend_(backend) {
  int world_size = 0;
  MINIDL_MPI_CHECK(MPI_Comm_size(world, &world_size));
  MINIDL_MPI_CHECK(MPI_Comm_rank(world, &rank_));
  grid_.check_world(world_size);  // every rank sees the same sizes, so every rank throws here or none does
  coord_ = grid_.coord_of(rank_);
  const GridCoord c = coord_;
  // Colour = the coordinates that stay fixed along the axis; key = the one that varies (the group rank). Every
  // group but the replicas' lies inside one replica: its colour counts the replica too (`in`).
  const Grid& g = grid_;
  auto in = [&](int colour) { return c.replica * g.size() / g.replicas + colour; };
  const int dcp = c.dp * g.cp + c.cp;  // the (dp, cp) pair: one replica's copy of the parameters and its tokens
  dp_group_ = split_group(world, in(c.pp * g.tp + c.tp), dcp, backend, device);
  cp_group_ = split_group(world, in((c.pp * g.dp + c.dp) * g.tp + c.tp), c.cp, backend, device);
  tp_group_ = split_group(world, in(c.pp * g.dp * g.cp + dcp), c.tp, backend, device);
  pp_group_ = split_group(world, in(dcp * g.tp + c.tp), c.pp, backend, device);
  const bool holds_embedding = first_stage() || last_stage();
  embedding_group_ = split_group(world, holds_embedding ? in(dcp * g.tp + c.tp) : MPI_UNDEFINED, c.pp, backend, device);
  model_parallel_group_ = split_group(world, in(dcp), c.pp * g.tp + c.tp, backend, device);
  replica_group_ = split_group(world, (c.pp * g.dp * g.cp + dcp) * g.tp + c.tp, c.replica,
                               backend == "nccl" ? "mpi" : backend, Device::cpu());
  const int groups = g.dp * g.cp / g.ep;  // ep groups per dp group
  ep_group_ = split_group(world, in((c.pp * g.tp + c.tp) * groups + dcp / g.ep), dcp % g.ep, backend, device);
  expert_dp_group_ = split_group(world, in((c.pp * g.tp + c.tp) * g.ep + dcp % g.ep), dcp / g.ep, backend, device);
  // What the flight recorder and the watchdog call them.
  dp_group_->set_label(g.cp > 1 ? "dp_cp" : "dp");
  cp_group_->set_label("cp");
  tp_group_->set_label("tp");
  pp_group_->set_label("pp");
  if (embedding_group_) embedding_group_->set_label("embedding");
  model_parallel_group_->set_label("model_parallel");
  replica_group_->set_label("replica");
  ep_group_->set_label("ep");
  expert_dp_group_->set_label("expert_dp");
}

}  // namespace minidl::dist
