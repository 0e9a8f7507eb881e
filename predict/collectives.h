// Collective costs from α-β (Hockney) link costs: a message of S bytes over a link takes α + S/β. The formulas are
// those of the algorithms minidl and NCCL run, for n ranks and a buffer of S bytes (the full buffer: the
// all-reduce's input, the reduce-scatter's input, the all-gather's output, as in nccl-tests):
//
//   ring all-reduce       2(n−1)/n · S/β + 2(n−1)·α   reduce-scatter then all-gather, each n−1 steps of S/n bytes
//   ring reduce-scatter   (n−1)/n · S/β + (n−1)·α     n−1 steps, each sending one chunk of S/n to the next rank
//   ring all-gather       (n−1)/n · S/β + (n−1)·α     the same steps in reverse
//   tree all-reduce       2·S/β + 2·⌈log2 n⌉·α        NCCL's double binary tree: reduce up and broadcast down,
//                                                     pipelined so each rank sends and receives S per direction;
//                                                     fewer steps, so it wins for small S on many ranks
//   point-to-point        S/β + α                     one message (pipeline activations and gradients)
//   pairwise all-to-all   (n−1)/n · S/β + (n−1)·α     n−1 rounds, each sending S/n to one peer (S: the rank's whole
//                                                     send buffer; its own part stays); uneven parts: S their sum
//
//   predict::Link nvlink{3.4e-6, 300e9};
//   predict::ring_all_reduce(8, 1 << 30, nvlink);   // 2·7/8·2^30/300e9 + 14·3.4e-6 s
//
// Which link a group uses follows where its ranks live: dist/topology.h numbers ranks tp fastest, then dp, then pp,
// rank = (pp_rank · dp + dp_rank) · tp + tp_rank, and a node holds gpus_per_node consecutive ranks. A ring over a
// group whose ranks sit on more than one node is as slow as its slowest hop, the inter-node link.
#pragma once

#include "dist/topology.h"
#include "predict/machine.h"

namespace minidl::predict {

double ring_all_reduce(int n, double bytes, const Link& link);
double ring_reduce_scatter(int n, double bytes, const Link& link);
double ring_all_gather(int n, double bytes, const Link& link);
double tree_all_reduce(int n, double bytes, const Link& link);
double point_to_point(double bytes, const Link& link);
double all_to_all(int n, double bytes, const Link& link);
// The faster of the ring and the tree, as NCCL picks per size (n = 1: nothing to do).
double all_reduce(int n, double bytes, const Link& link);

enum class Axis { kDp, kTp, kPp };
const char* axis_name(Axis axis);

// The most nodes any one group along `axis` spans in `grid` on nodes of gpus_per_node ranks.
int nodes_spanned(const dist::Grid& grid, Axis axis, int gpus_per_node);
// The link a group along `axis` is limited by for collective `c`: within a node (every such group fits in one),
// the machine's link measured for `c`, or intra; else inter.
const Link& group_link(const dist::Grid& grid, Axis axis, const Machine& machine,
                       Collective c = Collective::kAllReduce);

}  // namespace minidl::predict
