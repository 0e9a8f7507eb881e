// Naive ZeRO stage 1 with AdamW: each rank keeps the optimizer state (AdamW's m and v) of only 1/N of the
// parameters. Read after naive/ddp.h; the production version is dist/zero.h.
//
//   dist::naive::Zero1AdamW zero(model, group, optim::decay_groups(model.named_parameters(), 0.1), {.lr = 1e-3});
//   model.loss(x_slice, y_slice).backward();   // each rank: the gradient of its own slice
//   zero.step();                               // reduce-scatter, AdamW on this rank's shard, all-gather
//   zero.step(1.0);                            // the same, the gradient first clipped to norm 1 (grad_norm())
//
// The idea. Lay every parameter end to end in one flat vector of Ψ elements, padded to P (a multiple of N), and
// give rank r the contiguous shard [r·P/N, (r+1)·P/N). AdamW is elementwise: element i's update needs only element
// i's weight, gradient, m and v. So rank r can update its shard alone, if it has the *averaged* gradient of its
// shard, and then everyone needs everyone's updated shard back. One step:
//   1. reduce-scatter (average) the flat gradient: rank r receives the average over ranks of its shard only;
//   2. AdamW on the shard, with m and v of the shard only (P/N elements each, not P);
//   3. all-gather the shards of the flat parameter vector: every rank holds every updated weight again.
// The result equals DDP + AdamW: DDP's all-reduce *is* a reduce-scatter followed by an all-gather (that is how a
// ring implements it), and ZeRO-1 only moves the elementwise AdamW between the two halves, applying it to the
// gradient shard instead of to the whole vector on every rank.
//
// Communication per step, per rank, with a ring: reduce-scatter (N-1)/N·Ψ + all-gather (N-1)/N·Ψ = 2(N-1)/N·Ψ,
// exactly DDP's all-reduce: the memory saving is free. Memory, f32: params 4Ψ + grads 4Ψ + AdamW 8Ψ/N, against
// DDP's 16Ψ (ZeRO-2 would also keep only the gradient shard: 4Ψ + 12Ψ/N). This version also keeps a flat copy of
// the gradients (4Ψ); production's gradients are views of its buckets, so it has none.
//
// What the production version (dist/zero.h) adds: buckets (one reduce-scatter per bucket, overlapped with backward
// on a communication thread, as DDP's all-reduces are), ZeRO-2's freed gradient buckets, gradient accumulation,
// device buffers, and checkpoints of the sharded optimizer state (dist/zero_state.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "dist/process_group.h"
#include "dist/shard.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace minidl::dist::naive {

class Zero1AdamW {
 public:
  // groups: the module's parameters (contiguous f32) and their weight decay. Collective: broadcasts rank 0's
  // parameters, so all ranks start from the same model.
  Zero1AdamW(nn::Module& model, ProcessGroup& group, const std::vector<optim::ParamGroup>& groups,
             const optim::AdamWOptions& options)
      : group_(group) {
    for (auto [name, b] : model.named_buffers()) group.broadcast(b, 0)->wait();
    int64_t numel = 0;
    for (const optim::ParamGroup& g : groups)
      for (const Tensor& p : g.params) params_.push_back(p), numel += p.numel();
    const int64_t padded = padded_numel(numel, group.size()), shard = padded / group.size();
    const int64_t first = group.rank() * shard;  // this rank owns flat elements [first, first + shard)
    flat_params_ = Tensor::zeros({padded});
    flat_grads_ = Tensor::zeros({padded});
    grad_shard_ = Tensor::zeros({shard});
    // Re-point every parameter into the flat vector (set_data: the model's layers hold the same handles), so the
    // all-gather of step 3 writes the updated weights straight into the model.
    std::vector<optim::ParamGroup> shard_groups;
    int64_t offset = 0;
    for (const optim::ParamGroup& group_of_params : groups) {
      shard_groups.push_back({{}, group_of_params.weight_decay});
      for (Tensor p : group_of_params.params) {
        group.broadcast(p, 0)->wait();
        Tensor view = flat_params_.as_strided(p.shape(), contiguous_strides(p.shape()), offset);
        view.copy_(p.detach());
        p.set_data(view);
        // The part of p inside this rank's shard becomes a parameter of the shard's optimizer (a leaf viewing the
        // flat vector, its gradient a view of grad_shard_), with p's weight decay.
        // EXERCISE(zero1): the part of p inside this rank's shard [first, first + shard), if any, becomes a leaf
        // viewing flat_params_ whose gradient views grad_shard_, added to shard_groups.back().
        const int64_t begin = std::max(first, offset), end = std::min(first + shard, offset + p.numel());
        if (begin < end) {
          Tensor piece = flat_params_.as_strided({end - begin}, {1}, begin).set_requires_grad(true);
          piece.set_grad(grad_shard_.as_strided({end - begin}, {1}, begin - first));
          shard_groups.back().params.push_back(piece);
        }
        // END EXERCISE
        offset += p.numel();
      }
    }
    std::erase_if(shard_groups, [](const optim::ParamGroup& sg) { return sg.params.empty(); });
    adamw_ = std::make_unique<optim::AdamW>(shard_groups, options);  // m and v: shard elements only
  }

  // Collective, after backward: one AdamW step of the whole model; the parameters' gradients are zeroed. With
  // max_norm > 0 the averaged gradient is first clipped to that global L2 norm, as one process clips it. Returns
  // the norm before clipping (0 when not asked).
  double step(double max_norm = 0) {
    double norm = 0;
    // 0. Flatten this rank's gradients into one vector with the parameters' layout (padding stays zero).
    // EXERCISE(zero1): flatten the gradients into flat_grads_; reduce-scatter (average) into grad_shard_; clip it by
    // grad_norm() when max_norm > 0; step AdamW; all-gather the updated shards into flat_params_; zero the gradients.
    int64_t offset = 0;
    for (Tensor& p : params_) {
      MINIDL_CHECK(p.grad().defined(), "naive ZeRO-1: a parameter of shape ", p.shape(), " has no gradient");
      flat_grads_.as_strided({p.numel()}, {1}, offset).copy_(p.grad().reshape({p.numel()}));
      offset += p.numel();
    }
    // 1. grad_shard_ = the average over ranks of this rank's shard of the flat gradient.
    group_.reduce_scatter(grad_shard_, flat_grads_, ReduceOp::kAvg)->wait();
    if (max_norm > 0 && (norm = grad_norm()) > max_norm)  // the pieces' gradients view grad_shard_
      for (const optim::ParamGroup& g : adamw_->param_groups())
        optim::scale_grads(g.params, optim::clip_factor(norm, max_norm));
    // 2. AdamW on the shard's pieces: they view flat_params_, so the shard is updated in place.
    adamw_->step();
    // 3. Every rank sends its updated shard and receives the others': flat_params_ (the model) is whole again.
    const int64_t shard = grad_shard_.numel();
    group_.all_gather(flat_params_, flat_params_.as_strided({shard}, {1}, group_.rank() * shard))->wait();
    for (Tensor& p : params_) p.grad().zero_();
    // END EXERCISE
    return norm;
  }

  // Collective, after the reduce-scatter: the L2 norm of the whole averaged gradient, which no rank holds whole. The
  // squares of this rank's shard (its padding is zero) summed over the group: every rank gets the same norm, so
  // every shard is scaled alike.
  double grad_norm() {
    // EXERCISE(zero1): the sum of squares of grad_shard_, summed over the group, and its square root.
    double squares = 0;
    for (double g : grad_shard_.to_vector()) squares += g * g;
    Tensor sum = Tensor::from_vector(std::vector<double>{squares}, {1}, DType::f64);
    group_.all_reduce(sum, ReduceOp::kSum)->wait();
    return std::sqrt(sum.to_vector()[0]);
    // END EXERCISE
  }

  optim::AdamW& optimizer() { return *adamw_; }  // set_lr, state()

 private:
  ProcessGroup& group_;
  std::vector<Tensor> params_;  // the module's, in flat-vector order
  Tensor flat_params_, flat_grads_, grad_shard_;
  std::unique_ptr<optim::AdamW> adamw_;
};

}  // namespace minidl::dist::naive
