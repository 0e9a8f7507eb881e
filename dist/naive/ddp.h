// Naive data parallelism: the shortest correct DDP. Read this first, then dist/ddp.h and dist/reducer.h.
//
//   dist::naive::DataParallel dp(model, group);   // every rank now holds rank 0's weights
//   model.loss(x_slice, y_slice).backward();      // each rank: the gradient of its own slice's mean loss
//   dp.average_gradients();                       // each rank: the gradient of the global batch's mean loss
//   optimizer.step();                             // identical gradients, identical weights: the ranks stay in step
//
// Why it is correct. N ranks each hold the whole model and take B/N rows of the global batch of B rows. The loss
// of the global batch is the mean over its rows, so with L_r the mean loss of rank r's rows,
//   L = (1/B) sum_rows loss = (1/N) sum_r L_r   and so   dL/dw = (1/N) sum_r dL_r/dw,
// the average over ranks of the per-rank gradients: one all-reduce (average) per parameter. If every rank starts
// from the same weights (the broadcast) and applies the same optimizer to the same gradient, the weights stay equal
// on every rank forever, without ever being sent again.
//
// Communication per step: every gradient once through an all-reduce. For Ψ parameters a ring all-reduce sends
// (and receives) 2(N-1)/N·Ψ elements per rank: a reduce-scatter then an all-gather, each (N-1)/N·Ψ. Independent
// of N, which is why DDP scales. Memory: the whole model, its gradients and optimizer state on every rank (16Ψ
// bytes with AdamW in f32), nothing extra.
//
// What the production version (dist/ddp.h, dist/reducer.h) adds:
// - buckets: one all-reduce per ~25 MiB of gradients, not one per parameter (a collective's fixed latency,
//   paid a few times instead of once per bias vector);
// - overlap: a bucket's all-reduce starts, on a communication thread, as soon as its last gradient is ready,
//   while backward still runs for the layers before it; here all communication waits for the whole backward;
// - flat buffers: the gradients are views of the buckets, so nothing is copied in or out;
// - no_sync() for gradient accumulation, unused-parameter detection, CUDA streams.
#pragma once

#include <unordered_set>

#include "dist/process_group.h"
#include "nn/module.h"

namespace minidl::dist::naive {

class DataParallel {
 public:
  // Collective: every rank gets rank 0's parameters and buffers, so all ranks start from the same model.
  DataParallel(nn::Module& model, ProcessGroup& group) : model_(model), group_(group) {
    // EXERCISE(ddp): make every rank hold rank 0's parameters and buffers.
    for (auto [name, p] : model.named_parameters()) group.broadcast(p, 0)->wait();
    for (auto [name, b] : model.named_buffers()) group.broadcast(b, 0)->wait();
    // END EXERCISE
  }

  // Collective, after backward: every parameter's gradient becomes its average over the ranks of the group.
  // Each rank visits the parameters in the same order (the module's), so the ranks pair the same all-reduces. A
  // tensor registered under two names (tied weights) is averaged once: twice would cost twice the traffic. One the
  // loss did not use has no gradient and gets none: every rank runs the same model, so all of them skip it.
  void average_gradients() {
    // EXERCISE(ddp): average each trained parameter's gradient over the group, in place, in the same order on every
    // rank, each tensor once (a tied one has two names); frozen and unused parameters keep no gradient.
    std::unordered_set<const TensorImpl*> seen;
    for (auto [name, p] : model_.named_parameters()) {
      if (!p.requires_grad() || !seen.insert(p.impl()).second) continue;
      Tensor grad = p.grad();
      if (!grad.defined()) continue;                    // unused by the loss, on every rank alike: it keeps none
      group_.all_reduce(grad, ReduceOp::kAvg)->wait();  // in place: p.grad() now holds the average
    }
    // END EXERCISE
  }

 private:
  nn::Module& model_;
  ProcessGroup& group_;
};

}  // namespace minidl::dist::naive
