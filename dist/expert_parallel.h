// Expert parallelism: a mixture of experts' E experts (nn/moe.h) spread over the ep ranks of a group (a part of the
// data-parallel group: dist::Topology::ep_group), rank r holding experts [r E/ep, (r + 1) E/ep), applied from
// outside the model as dist/tensor_parallel.h is:
//
//   auto chunk = std::make_shared<nn::GPT>(cfg, seed, part);       // the whole chunk, every expert
//   dist::apply_expert_parallel(*chunk, topology.ep_group());      // keeps this rank's, installs the exchange
//
// Each rank routes its own tokens (the router is replicated) and hands the layer's ExpertStyle its kept slots'
// rows, expert-major, which is destination-major too. The exchange (dist/naive/moe.h is its short form):
//   1. the counts: an all-to-all of E/ep numbers per peer, so a rank knows what it receives from whom;
//   2. the rows: an all-to-all; they arrive group-major (each peer's rows for my experts in turn) and are permuted
//      expert-major (nn::expert_major_order), one GEMM chain per local expert;
//   3. back: the inverse permutation and the all-to-all home (the counts swapped).
// Backward mirrors it: each all-to-all's gradient is the exchange back, a permutation's its inverse.
//
// Traffic per MoE layer and step: a rank sends each of its slots routed to another rank's expert as C values four
// times (out and home, forward and backward), plus the counts; ExpertParallel::rows_sent() counts those slots.
// Memory: E/ep experts' weights, gradients and AdamW moments per rank instead of E.
//
// The gradients: a dense parameter averages over the dp group as before. An expert's gradient on rank r already sums
// the contributions of every token its ep group routed to it, each a gradient of its own rank's loss; one process's
// gradient is the mean over the dp ranks of those losses' gradients, so an expert's gradient is summed over the
// ranks holding it (the expert-dp group) and divided by dp: averaged over the expert-dp group, then divided by ep
// (train::GradSync). Averaging it over the whole dp group instead mixes other experts' gradients in; averaging over
// the expert-dp group alone leaves it ep times too large (pytorch #160285's 2x at ep 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "nn/gpt.h"
#include "nn/moe.h"

namespace minidl::dist {

class ExpertParallel : public nn::ExpertStyle {
 public:
  ExpertParallel(ProcessGroup& group, int64_t experts);
  Tensor run(const Tensor& rows, const std::vector<int64_t>& kept,
             const std::function<Tensor(int64_t, const Tensor&)>& expert) const override;
  // The experts this rank holds: [first(), first() + per_rank()).
  int64_t first() const { return int64_t(group_.rank()) * per_rank_; }
  int64_t per_rank() const { return per_rank_; }
  // The slots this rank sent to another rank's experts, over every forward so far (the traffic's unit).
  int64_t rows_sent() const { return *rows_sent_; }

 private:
  ProcessGroup& group_;
  int64_t per_rank_;
  std::shared_ptr<int64_t> rows_sent_ = std::make_shared<int64_t>(0);
};

// Keeps this rank's experts of every MoE layer of `model` (the whole model or a pipeline chunk, built whole) and
// installs the exchange over `group`. Throws unless the group's size divides the experts.
void apply_expert_parallel(nn::GPT& model, ProcessGroup& group);
// Whether `name` is a routed expert's parameter (moe.experts.<j>.*): held by some ranks of an ep group only.
bool is_expert_parameter(const std::string& name);

}  // namespace minidl::dist
