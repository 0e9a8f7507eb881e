#include "predict/collectives.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace minidl::predict {

double ring_reduce_scatter(int n, double bytes, const Link& link) {
  if (n <= 1) return 0;
  return double(n - 1) / n * bytes / link.beta + double(n - 1) * link.alpha;
}

double ring_all_gather(int n, double bytes, const Link& link) { return ring_reduce_scatter(n, bytes, link); }

double ring_all_reduce(int n, double bytes, const Link& link) {
  return ring_reduce_scatter(n, bytes, link) + ring_all_gather(n, bytes, link);
}

double tree_all_reduce(int n, double bytes, const Link& link) {
  if (n <= 1) return 0;
  return 2 * bytes / link.beta + 2 * std::ceil(std::log2(double(n))) * link.alpha;
}

double point_to_point(double bytes, const Link& link) { return bytes / link.beta + link.alpha; }

double all_to_all(int n, double bytes, const Link& link) { return ring_reduce_scatter(n, bytes, link); }

double all_reduce(int n, double bytes, const Link& link) {
  return std::min(ring_all_reduce(n, bytes, link), tree_all_reduce(n, bytes, link));
}

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::kDp: return "dp";
    case Axis::kTp: return "tp";
    case Axis::kPp: return "pp";
  }
  return "?";
}

int nodes_spanned(const dist::Grid& grid, Axis axis, int gpus_per_node) {
  MINIDL_CHECK(gpus_per_node >= 1, "nodes_spanned: gpus_per_node must be >= 1, got ", gpus_per_node);
  // Groups along one axis differ only in the other two coordinates; every group is visited once (at 4,096 ranks,
  // 4,096 ranks in all). Ranks grow with the coordinate along the axis, so a group's nodes are the changes of
  // rank / gpus_per_node along it.
  const int size = axis == Axis::kDp ? grid.dp : axis == Axis::kTp ? grid.tp : grid.pp;
  int most = 1;
  for (int a = 0; a < grid.dp; ++a)
    for (int b = 0; b < grid.tp; ++b)
      for (int c = 0; c < grid.pp; ++c) {
        dist::GridCoord x{a, b, c};
        int& along = axis == Axis::kDp ? x.dp : axis == Axis::kTp ? x.tp : x.pp;
        if (along != 0) continue;  // one leader per group
        int nodes = 0, last = -1;
        for (int i = 0; i < size; ++i) {
          along = i;
          const int node = grid.rank_of(x) / gpus_per_node;
          nodes += node != last;
          last = node;
        }
        most = std::max(most, nodes);
      }
  return most;
}

const Link& group_link(const dist::Grid& grid, Axis axis, const Machine& machine, Collective c) {
  return nodes_spanned(grid, axis, machine.gpus_per_node) > 1 ? machine.inter : machine.intra_for(c);
}

}  // namespace minidl::predict
