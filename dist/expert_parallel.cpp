#include "dist/expert_parallel.h"

#include <numeric>

#include "autograd/functions.h"
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "dist/flight_recorder.h"
#include "ops/cast.h"

namespace minidl::dist {

namespace {

// An all-to-all of rows (R, C): send[j] rows to rank j, recv[j] from it, in rank order; its gradient is the
// exchange back, the counts swapped.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                       ProcessGroup& group) {
  const int64_t C = x.size(1);
  auto exchange = [&group, C](const Tensor& in, const std::vector<int64_t>& s, const std::vector<int64_t>& r) {
    std::vector<int64_t> s_elems, r_elems;  // the collective counts elements
    for (int64_t n : s) s_elems.push_back(n * C);
    for (int64_t n : r) r_elems.push_back(n * C);
    Tensor out = Tensor::empty({std::accumulate(r.begin(), r.end(), int64_t(0)), C}, in.dtype(), in.device());
    const CallSite site("expert parallel: rows");
    group.all_to_all(out, in.contiguous(), s_elems, r_elems)->wait();
    return out;
  };
  Tensor y = exchange(x.detach(), send, recv);
  return autograd::record("expert_all_to_all", {x}, y, [exchange, send, recv](const Tensor& g) {
    return std::vector<Tensor>{exchange(g, recv, send)};
  });
}

Tensor ids(const std::vector<int64_t>& v, Device device) {
  return Tensor::from_vector(v, {int64_t(v.size())}).to(device);
}

// rows of a table, differentiably (the gradient scattered back); 16-bit tables through an f32 copy.
Tensor gather(const Tensor& table, const std::vector<int64_t>& at) {
  const DType dt = table.dtype();
  if (!ops::is_half(dt)) return embedding(table, ids(at, table.device()));
  return autograd::autocast_to(embedding(autograd::autocast_to(table, DType::f32), ids(at, table.device())), dt);
}

}  // namespace

ExpertParallel::ExpertParallel(ProcessGroup& group, int64_t experts)
    : group_(group), per_rank_(experts / group.size()) {
  MINIDL_CHECK(per_rank_ * group.size() == experts, "expert parallelism: --ep ", group.size(),
               " must divide --moe-experts ", experts, " (each rank holds the same number of experts)");
}

Tensor ExpertParallel::run(const Tensor& rows, const std::vector<int64_t>& kept,
                           const std::function<Tensor(int64_t, const Tensor&)>& expert) const {
  const int ranks = group_.size(), me = group_.rank();
  const int64_t E = int64_t(kept.size());
  // 1. The counts: each peer's rows for each of my experts (group-major).
  Tensor out_counts = Tensor::from_vector(std::vector<double>(kept.begin(), kept.end()), {E}, DType::f64);
  out_counts = out_counts.to(rows.device());
  Tensor in_counts = Tensor::empty({E}, DType::f64, rows.device());
  {
    const CallSite site("expert parallel: counts");
    const std::vector<int64_t> each(size_t(ranks), per_rank_);
    group_.all_to_all(in_counts, out_counts, each, each)->wait();
  }
  const std::vector<double> got = in_counts.to_vector();
  std::vector<int64_t> mine(got.size()), send(size_t(ranks), 0), recv(size_t(ranks), 0);
  for (int j = 0; j < ranks; ++j)
    for (int64_t e = 0; e < per_rank_; ++e) {
      const size_t i = size_t(j * per_rank_ + e);
      mine[i] = int64_t(got[i]);
      send[size_t(j)] += kept[i];
      recv[size_t(j)] += mine[i];
    }
  for (int j = 0; j < ranks; ++j)
    if (j != me) *rows_sent_ += send[size_t(j)];
  // 2. The rows out, destination-major; in, permuted expert-major; one GEMM chain per local expert.
  const Tensor arrived = all_to_all_rows(rows, send, recv, group_);
  const std::vector<int64_t> order = nn::expert_major_order(mine, ranks, per_rank_);
  const Tensor local = gather(arrived, order);
  std::vector<Tensor> outs;
  int64_t at = 0, e = first();
  for (int64_t n : nn::rows_per_expert(mine, ranks, per_rank_)) {
    outs.push_back(expert(e++, local.narrow(0, at, n)));
    at += n;
  }
  // 3. Back to group-major (the inverse of `order`), and home.
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[size_t(order[i])] = int64_t(i);
  return all_to_all_rows(gather(cat(outs, 0), inverse), recv, send, group_);
}

void apply_expert_parallel(nn::GPT& model, ProcessGroup& group) {
  if (group.size() == 1) return;
  for (nn::MoE* moe : nn::moe_layers(model)) {
    auto style = std::make_shared<ExpertParallel>(group, moe->config().moe_experts);
    moe->keep_experts(style->first(), style->per_rank());
    moe->style = style;
  }
}

bool is_expert_parameter(const std::string& name) { return name.find(".moe.experts.") != std::string::npos; }

}  // namespace minidl::dist
