// Naive DDP with overlap: the gradients are averaged in buckets, and a bucket's all-reduce starts as soon as its
// last gradient is ready, while the backward still runs for the layers before it. Read after naive/ddp.h; the
// production version is dist/reducer.h (a communication thread, flat buffers the gradients view, no copies).
//
//   dist::naive::OverlappedDataParallel dp(model, group, /*bucket_cap=*/1 << 20);   // elements per bucket
//   model.loss(x_slice, y_slice).backward();   // each bucket's all-reduce launched from a grad-ready hook
//   dp.finish();                               // waits for every handle: the gradients now hold the averages
//   optimizer.step();
//
// Why buckets, and why this order. The backward produces the last layer's gradients first. Cut the trained tensors,
// taken in reverse registration order, into buckets of at most bucket_cap elements: the first bucket is complete
// after the first few layers' backward, and its all-reduce runs while autograd computes the rest. One all-reduce
// per bucket, not per tensor, pays a collective's fixed latency a few times instead of once per bias vector.
// Communication is the same as naive DDP's, 2(N-1)/N·Ψ per rank; what changes is when: hidden behind compute, but
// for the last bucket's.
//
// The handles. A launched all-reduce may still be running when the backward returns (on a GPU, or a communication
// thread), so finish() waits on every handle before anyone reads a gradient, then copies each bucket's average back
// into its tensors' gradients. Each rank launches its buckets in the order their gradients become ready, the same
// order everywhere (the same model, the same backward), so the ranks pair the same all-reduces.
//
// Limits: every trained parameter must get a gradient in every backward (production detects unused ones), and one
// backward per step (production's no_sync() accumulates).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "dist/process_group.h"
#include "nn/module.h"

namespace minidl::dist::naive {

class OverlappedDataParallel {
 public:
  // Collective: every rank gets rank 0's parameters and buffers; the buckets are assigned and the hooks set.
  OverlappedDataParallel(nn::Module& model, ProcessGroup& group, int64_t bucket_cap) : group_(group) {
    for (auto [name, p] : model.named_parameters()) group.broadcast(p, 0)->wait();
    for (auto [name, b] : model.named_buffers()) group.broadcast(b, 0)->wait();
    const auto named = model.named_parameters();
    std::unordered_set<const TensorImpl*> seen;  // a tied tensor (two names) belongs to one bucket, once
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      const Tensor& p = it->second;
      if (!p.requires_grad() || !seen.insert(p.impl()).second) continue;
      if (buckets_.empty() || (buckets_.back().numel + p.numel() > bucket_cap && !buckets_.back().params.empty()))
        buckets_.emplace_back();
      buckets_.back().params.push_back(p);
      buckets_.back().numel += p.numel();
    }
    std::weak_ptr<OverlappedDataParallel*> self = self_;  // the hooks outlive this object: dead once it is gone
    for (size_t i = 0; i < buckets_.size(); ++i)
      for (Tensor p : buckets_[i].params)
        p.register_grad_ready_hook([self, i](Tensor&) {
          if (auto d = self.lock()) (*d)->on_grad_ready(i);
        });
  }

  // Collective, after backward: waits for every bucket's all-reduce and puts the averages into the gradients.
  void finish() {
    // EXERCISE(ddp_overlap): for each bucket, refuse one never launched (a parameter without a gradient), wait on its
    // handle, copy the averaged flat buffer back into its tensors' gradients, and reset it for the next backward.
    for (Bucket& b : buckets_) {
      MINIDL_CHECK(b.work, "naive overlapped DDP: a bucket got ", b.ready, " of its ", b.params.size(),
                   " gradients in this backward (a trained parameter the loss did not use?)");
      b.work->wait();
      int64_t offset = 0;
      for (const Tensor& p : b.params) {
        Tensor grad = p.grad();
        grad.copy_(b.flat.narrow(0, offset, p.numel()).reshape(p.shape()));
        offset += p.numel();
      }
      b.work.reset();
      b.ready = 0;
    }
    // END EXERCISE
  }

  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<Tensor> params;  // in the order their gradients are expected (reverse registration)
    int64_t numel = 0;
    size_t ready = 0;            // gradients final in this backward
    Tensor flat;                 // the bucket's gradients end to end, all-reduced in place
    std::shared_ptr<Work> work;  // the launched all-reduce, until finish()
  };

  // A gradient of bucket i is final (its grad-ready hook).
  void on_grad_ready(size_t i) {
    // EXERCISE(ddp_overlap): when the bucket's last gradient is ready, copy its gradients into one flat buffer and
    // launch its all-reduce (kAvg); keep the handle, do not wait.
    Bucket& b = buckets_[i];
    if (++b.ready < b.params.size()) return;
    b.flat = Tensor::empty({b.numel});
    int64_t offset = 0;
    for (const Tensor& p : b.params) {
      b.flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape({p.numel()}));
      offset += p.numel();
    }
    b.work = group_.all_reduce(b.flat, ReduceOp::kAvg);
    // END EXERCISE
  }

  ProcessGroup& group_;
  std::vector<Bucket> buckets_;
  std::shared_ptr<OverlappedDataParallel*> self_ = std::make_shared<OverlappedDataParallel*>(this);
};

}  // namespace minidl::dist::naive
