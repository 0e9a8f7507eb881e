#include "dist/topology.h"

#include "dist/init.h"

namespace minidl::dist {

GridCoord Grid::coord_of(int rank) const {
  MINIDL_CHECK(rank >= 0 && rank < size(), "Grid::coord_of: rank ", rank, " outside a grid of ", size());
  return {.dp = (rank / tp) % dp, .tp = rank % tp, .pp = rank / (tp * dp)};
}

int Grid::rank_of(const GridCoord& c) const {
  MINIDL_CHECK(c.dp >= 0 && c.dp < dp && c.tp >= 0 && c.tp < tp && c.pp >= 0 && c.pp < pp, "Grid::rank_of: (dp ", c.dp,
               ", tp ", c.tp, ", pp ", c.pp, ") outside a grid of dp ", dp, " × tp ", tp, " × pp ", pp);
  return (c.pp * dp + c.dp) * tp + c.tp;
}

void Grid::check_world(int world_size) const {
  MINIDL_CHECK(dp >= 1 && tp >= 1 && pp >= 1, "Topology: dp, tp and pp must each be at least 1, got dp ", dp, ", tp ",
               tp, ", pp ", pp);
  MINIDL_CHECK(size() == world_size, "Topology: dp × tp × pp = ", dp, " × ", tp, " × ", pp, " = ", size(),
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
  // Colour = the coordinates that stay fixed along the axis; key = the one that varies (the group rank).
  dp_group_ = split_group(world, c.pp * grid_.tp + c.tp, c.dp, backend, device);
  tp_group_ = split_group(world, c.pp * grid_.dp + c.dp, c.tp, backend, device);
  pp_group_ = split_group(world, c.dp * grid_.tp + c.tp, c.pp, backend, device);
  const bool holds_embedding = first_stage() || last_stage();
  embedding_group_ =
      split_group(world, holds_embedding ? c.dp * grid_.tp + c.tp : MPI_UNDEFINED, c.pp, backend, device);
  model_parallel_group_ = split_group(world, c.dp, c.pp * grid_.tp + c.tp, backend, device);
  // What the flight recorder and the watchdog call them.
  dp_group_->set_label("dp");
  tp_group_->set_label("tp");
  pp_group_->set_label("pp");
  if (embedding_group_) embedding_group_->set_label("embedding");
  model_parallel_group_->set_label("model_parallel");
}

}  // namespace minidl::dist
