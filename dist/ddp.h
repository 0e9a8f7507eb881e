// DistributedDataParallel: every rank holds the whole model and computes gradients on its slice of the global
// batch; gradients are averaged across the ranks of the data-parallel group during backward, so after backward
// every rank holds the gradient of the global batch's mean loss, exactly as one process would.
//
//   dist::DistributedDataParallel ddp(model, topology.dp_group());   // broadcasts rank 0's weights
//   Tensor loss = model.loss(x_slice, y_slice);
//   loss.backward();            // buckets all-reduce while backward runs; its end waits for them
//   optimizer.step();
//   { auto guard = ddp.no_sync(); micro_loss.backward(); }   // gradient accumulation: no communication
//
// DDP is a thin layer over the Reducer (dist/reducer.h), which owns the buckets, the gradient-ready hooks, the
// communication thread and no_sync: DDP chooses the collective (an average all-reduce of each bucket, in place:
// the gradients are views of the buckets, so nothing is copied in or out) and broadcasts the initial weights.
//
// Communication per step: one all-reduce of every gradient, i.e. for P parameters each rank sends and receives
// 2·(n−1)/n·P elements with a ring (reduce-scatter + all-gather), whatever the number of ranks n. Memory: the
// gradients live in the buckets (no second copy), padded to a multiple of n per bucket.
//
// On a CUDA device (parameters on the device, a "nccl" group or the "ring" on that device) the buckets live on the
// device. The communication thread then only queues the all-reduces (nccl: on the group's stream, ordered by
// events), and the end of backward makes the compute stream wait for them without blocking the host.
// DDPStepStats then measure host time spent queueing and waiting, not the device's communication time.
#pragma once

#include <memory>

#include "dist/comm_hook.h"
#include "dist/powersgd.h"
#include "dist/reducer.h"
#include "nn/module.h"

namespace minidl::dist {

struct DDPOptions {
  BucketCaps caps;
  // A parameter that gets no gradient at all in a synchronising backward is an error naming it, unless this is
  // set. Then a parameter no rank used keeps an undefined gradient (optimizers skip it, as in PyTorch); one that
  // some rank used is averaged with zeros from the ranks that did not.
  bool allow_unused_parameters = false;
  // Broadcast rank 0's parameters and buffers at construction (off only for tests that build identical models).
  bool broadcast_at_start = true;
  // An explicit bucket assignment (ReducerOptions::buckets): the tests give DDP ZeRO-3's per-block buckets.
  std::vector<BucketSpec> buckets;
  // What each bucket's average sends (dist/comm_hook.h): f32, or 16 bits on the wire; or, when set, PowerSGD's
  // low-rank approximation (dist/powersgd.h; one state per DDP: it keeps each bucket's error and Q).
  Compression compression = Compression::kNone;
  std::shared_ptr<PowerSgd> powersgd{};
};

using DDPStepStats = ReducerStats;

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, ProcessGroup& group, DDPOptions options = {});
  // The same over (name, parameter) pairs that no one module holds (a model chunk without its tied weight); no
  // buffers.
  DistributedDataParallel(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroup& group,
                          DDPOptions options = {});

  ProcessGroup& group() { return reducer_.group(); }
  const std::vector<BucketSpec>& buckets() const { return reducer_.buckets(); }
  const DDPStepStats& last_step() const { return reducer_.last_step(); }
  Reducer& reducer() { return reducer_; }

  using NoSyncGuard = Reducer::NoSyncGuard;
  [[nodiscard]] NoSyncGuard no_sync() { return reducer_.no_sync(); }

 private:
  Reducer reducer_;
};

}  // namespace minidl::dist
