// Naive expert parallelism: an MoE layer's E experts spread over the N ranks of a group, rank r holding experts
// [r E/N, (r + 1) E/N), and each token's copies sent to the ranks of its experts and back by two all-to-alls.
// Read after naive/tensor_parallel.h; the layer itself is nn/moe.h.
//
//   dist::naive::ExpertParallelMoE ep(whole_moe, group);  // this rank's experts of an nn::MoE (balance none)
//   Tensor y = ep.forward(x);   // x: this rank's own tokens (B, T, C); y equals whole_moe.forward(x)
//
// Each rank routes its own tokens with the replicated router (its choice, gates and capacity are the whole layer's:
// nn::route) and sorts their copies ("slots") expert-major. Experts are contiguous per rank, so expert-major is
// also destination-major: the first rows go to rank 0, the next to rank 1, ... Then:
//   1. counts: an all-to-all of E/N numbers per peer (how many rows for each of its experts), so every rank knows
//      how many rows it receives from whom, and where each of its experts' rows sits;
//   2. dispatch: an all-to-all of the rows; they arrive group-major (rank 0's rows for my experts, then rank 1's)
//      and are permuted expert-major (nn::expert_major_order: torchtitan's _permute), one GEMM chain per expert;
//   3. combine: the inverse permutation, the all-to-all back (the same exchange with the counts swapped), then, at
//      home, each slot's row gated and summed per token, as one process does.
// Backward mirrors it: an all-to-all's gradient is the all-to-all back, a gather's is a scatter-add.
//
// Traffic per layer per step: each rank sends its off-rank slots' rows (C values each) twice forward (out and back)
// and twice backward: 4 · C · (the copies routed off-rank) values, against dense DDP's nothing for activations.
// Memory: E/N experts' weights, gradients and optimizer state per rank instead of E. The gradient of an expert
// sums every rank's tokens routed to it: its replicas (if the group is a part of the data-parallel ranks) average
// over the ranks holding the same experts, never over the whole dp group (pytorch #160285's 2x).
//
// What production adds (dist/expert_parallel.h, train_gpt --ep): the layer's own router, gates, capacity and
// balancing (the exchange is a style the unmodified nn::MoE calls), 16-bit rows, the experts' gradient average over
// the ranks holding them, their norm, and gathering them for --save.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "dist/process_group.h"
#include "nn/moe.h"

namespace minidl::dist::naive {

// An all-to-all of rows (R, C): send[j] rows to rank j, recv[j] from it (in rank order); backward sends the
// gradient's rows back, the counts swapped.
inline Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                              ProcessGroup& group) {
  const int64_t C = x.size(1);
  auto exchange = [&group, C](const Tensor& in, const std::vector<int64_t>& s, const std::vector<int64_t>& r) {
    std::vector<int64_t> s_elems, r_elems;  // the collective counts elements
    for (int64_t n : s) s_elems.push_back(n * C);
    for (int64_t n : r) r_elems.push_back(n * C);
    Tensor out = Tensor::empty({std::accumulate(r.begin(), r.end(), int64_t(0)), C}, in.dtype(), in.device());
    group.all_to_all(out, in.contiguous(), s_elems, r_elems)->wait();
    return out;
  };
  Tensor y = exchange(x.detach(), send, recv);
  return autograd::record("naive_all_to_all", {x}, y, [exchange, send, recv](const Tensor& g) {
    return std::vector<Tensor>{exchange(g, recv, send)};
  });
}

class ExpertParallelMoE {
 public:
  ExpertParallelMoE(const nn::MoE& whole, ProcessGroup& group)
      : whole_(whole), group_(group), per_rank_(int64_t(whole.experts->size()) / group.size()) {
    MINIDL_CHECK(per_rank_ * group.size() == int64_t(whole.experts->size()), "naive EP: ", group.size(),
                 " ranks do not divide ", whole.experts->size(), " experts");
    const nn::GPTConfig& c = whole.config();
    MINIDL_CHECK(c.moe_router == nn::GPTConfig::Router::kSoftmax && c.moe_balance == nn::GPTConfig::Balance::kNone &&
                     !whole.shared && c.dropout == 0,
                 "naive EP: the softmax router without balancing, shared experts or dropout");
  }

  // The experts this rank holds: [first(), first() + per_rank()).
  int64_t first() const { return group_.rank() * per_rank_; }
  int64_t per_rank() const { return per_rank_; }

  Tensor forward(const Tensor& x) const {
    const nn::GPTConfig& cfg = whole_.config();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T, E = cfg.moe_experts, K = cfg.moe_top_k;
    const int ranks = group_.size();
    const Tensor xf = x.reshape({N, C});
    // The replicated router, in f32, and the whole layer's choice (nn::route: top k, capacity per sequence).
    const Tensor scores = softmax(whole_.router->forward(xf));
    const nn::Routing r =
        nn::route(scores.detach().to_vector(), N, E, K, nn::expert_capacity(cfg.moe_capacity, T, K, E), T);
    std::vector<int64_t> gate_at(size_t(N * K)), token_of_row;
    for (int64_t s = 0; s < N * K; ++s) gate_at[size_t(s)] = (s / K) * E + r.expert[size_t(s)];
    Tensor gates = embedding(scores.reshape({N * E, 1}), ids(gate_at)).reshape({N, K});
    if (K > 1) gates = gates / sum(gates, 1, true);
    for (int64_t slot : r.order) token_of_row.push_back(slot / K);

    // 1. counts: kept[e] for each peer's experts out; what each peer sends for each of mine in.
    std::vector<int64_t> mine(size_t(ranks * per_rank_)), send(size_t(ranks), 0), recv(size_t(ranks), 0);
    Tensor out_counts = Tensor::from_vector(std::vector<double>(r.kept.begin(), r.kept.end()), {E}, DType::f64);
    Tensor in_counts = Tensor::empty({E}, DType::f64, x.device());
    out_counts = out_counts.to(x.device());
    group_
        .all_to_all(in_counts, out_counts, std::vector<int64_t>(size_t(ranks), per_rank_),
                    std::vector<int64_t>(size_t(ranks), per_rank_))
        ->wait();
    const std::vector<double> got = in_counts.to_vector();  // group-major: peer j's rows for each of my experts
    for (int64_t j = 0; j < ranks; ++j)
      for (int64_t e = 0; e < per_rank_; ++e) {
        mine[size_t(j * per_rank_ + e)] = int64_t(got[size_t(j * per_rank_ + e)]);
        send[size_t(j)] += r.kept[size_t(j * per_rank_ + e)];
        recv[size_t(j)] += mine[size_t(j * per_rank_ + e)];
      }

    // 2. dispatch: my slots' rows out, destination-major; the peers' rows in, permuted expert-major.
    const Tensor arrived = all_to_all_rows(embedding(xf, ids(token_of_row)), send, recv, group_);
    const std::vector<int64_t> order = nn::expert_major_order(mine, ranks, per_rank_);
    const Tensor rows = embedding(arrived, ids(order));
    std::vector<Tensor> outs;
    int64_t at = 0;
    for (int64_t e : nn::rows_per_expert(mine, ranks, per_rank_)) {
      const int64_t local = int64_t(outs.size());
      outs.push_back((*whole_.experts)[size_t(first() + local)].forward(rows.narrow(0, at, e)));
      at += e;
    }

    // 3. combine: back to group-major (the inverse of `order`), home, then gated and summed per token.
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[size_t(order[i])] = int64_t(i);
    const Tensor home = all_to_all_rows(embedding(cat(outs, 0), ids(inverse)), recv, send, group_);
    std::vector<int64_t> slot_rows(size_t(N * K));
    for (int64_t s = 0; s < N * K; ++s) slot_rows[size_t(s)] = r.row[size_t(s)] >= 0 ? r.row[size_t(s)] : home.size(0);
    const Tensor padded = cat({home, Tensor::zeros({1, C}, home.dtype(), home.device())}, 0);  // a dropped slot: 0
    const Tensor slots = embedding(padded, ids(slot_rows)).reshape({N, K, C});
    return sum(slots * gates.reshape({N, K, 1}), 1).reshape({B, T, C});
  }

 private:
  Tensor ids(const std::vector<int64_t>& v) const {
    return Tensor::from_vector(v, {int64_t(v.size())}).to(whole_.router->weight.device());
  }

  const nn::MoE& whole_;
  ProcessGroup& group_;
  int64_t per_rank_;
};

}  // namespace minidl::dist::naive
