// DistributedDataParallel: every rank holds the whole model and computes gradients on its slice of the global
// batch; gradients are averaged across ranks during backward, so after backward every rank holds the gradient of
// the global batch's mean loss, exactly as one process would.
//
//   dist::DistributedDataParallel ddp(model, topology.dp_group());   // broadcasts rank 0's weights
//   Tensor loss = model.loss(x_slice, y_slice);
//   loss.backward();            // buckets all-reduce while backward runs; its end waits for them
//   optimizer.step();
//   { auto guard = ddp.no_sync(); micro_loss.backward(); }   // gradient accumulation: no communication
//
// How the overlap works (the Reducer): parameters are grouped into flat buckets (dist/bucketing.h). Each
// parameter's gradient-ready hook copies its gradient into its bucket; when a bucket's last gradient arrives, the
// bucket is handed to a communication thread that all-reduces it (average) while the main thread continues
// backward through earlier layers. A callback at the end of backward waits for every bucket and copies the
// averaged values back into the parameters' .grad().
//
// On a CUDA device (parameters on the device, a "nccl" group or the "ring" on that device) the buckets live on the
// device and every copy is queued on its compute stream. The communication thread then only queues the
// all-reduces (nccl: on the group's stream, ordered by events), and the end of backward makes the compute stream
// wait for them without blocking the host; the optimizer's kernels queued afterwards see the averaged gradients.
// DDPStepStats then measure host time spent queueing and waiting, not the device's communication time.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/bucketing.h"
#include "dist/process_group.h"
#include "nn/module.h"

namespace minidl::dist {

struct DDPOptions {
  BucketCaps caps;
  // A parameter that gets no gradient in a backward is an error naming it, unless this is set (its gradient is then
  // taken as zero on this rank, which is what the average needs).
  bool allow_unused_parameters = false;
  // Broadcast rank 0's parameters and buffers at construction (off only for tests that build identical models).
  bool broadcast_at_start = true;
};

// Time spent in the last synchronised backward, in milliseconds.
struct DDPStepStats {
  double comm_ms = 0;          // the communication thread's time in all-reduces
  double exposed_comm_ms = 0;  // time the main thread waited for communication at the end of backward
  int buckets = 0;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, ProcessGroup& group, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }
  const std::vector<BucketSpec>& buckets() const { return buckets_; }
  const DDPStepStats& last_step() const { return stats_; }

  // While a NoSyncGuard lives, backward only accumulates local gradients; the next backward outside one averages
  // the accumulated gradients.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSyncGuard() { ddp_.sync_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

 private:
  struct Bucket {
    Tensor buffer;           // flat, the bucket's dtype, on the parameters' device
    std::shared_ptr<Work> work;  // its all-reduce in this backward, until finish_backward waits on it
    int pending = 0;         // gradients still to arrive in this backward
    bool launched = false;
    bool done = false;
  };
  struct Shared;             // what the parameters' hooks point at (outlives nothing: hooks hold a weak_ptr)

  void on_grad_ready(size_t param, const Tensor& grad);
  void launch(size_t bucket);
  void finish_backward();
  void comm_loop();
  static Tensor flat(const Tensor& t);  // a contiguous tensor viewed as 1-D
  Tensor slot(size_t param);            // the parameter's span of its bucket

  nn::Module& module_;
  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<BucketSpec> buckets_;
  std::vector<size_t> bucket_of_, slot_of_;  // param -> bucket, param -> index within the bucket
  std::vector<Bucket> state_;
  std::vector<bool> ready_;
  bool sync_ = true;
  bool in_backward_ = false;
  DDPStepStats stats_;
  std::shared_ptr<Shared> shared_;

  // The communication thread and its queue.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  bool stop_ = false;
  double comm_ms_ = 0;
  std::exception_ptr comm_error_;
  std::thread comm_thread_;
};

}  // namespace minidl::dist
