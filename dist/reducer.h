// Reducer: the bucket machinery under DDP and ZeRO-2/3. It turns "a parameter's gradient is final" (autograd's
// gradient-ready hook) into one collective per bucket, launched while backward is still running, on a
// communication thread.
//
//   dist::Reducer reducer(model.named_parameters(), group,
//                         [](dist::ProcessGroup& g, size_t, Tensor& buf) { return g.all_reduce(buf,
//                         dist::ReduceOp::kAvg); });
//   loss.backward();                 // buckets reduce as their gradients arrive; the end of backward waits for them
//   { auto guard = reducer.no_sync(); micro_loss.backward(); }   // accumulation: no communication
//
// What it guarantees:
// - **Gradients are views of the buckets.** A parameter's .grad() becomes a view of its span of a flat bucket
//   buffer the first time its gradient arrives (one copy, once); from then on autograd accumulates straight into
//   the bucket and the collective reduces it in place, so a steady-state step copies nothing in or out.
//   (Optimizer::zero_grad zeroes in place and keeps the views.)
// - **Buckets are reduced strictly in bucket-index order on every rank**, like PyTorch's Reducer: a bucket that
//   becomes ready early waits for the buckets before it. Launching in readiness order would let two ranks, whose
//   gradients became ready in different orders (a parameter unused on one of them), pair different buckets in
//   the same collective: silently wrong sums, or a size mismatch.
// - Buckets are padded to a multiple of the group size (dist/shard.h: padded_numel), so a bucket reduce-scatters
//   into equal shards; the padding stays zero.
// - **Unused parameters.** A parameter that got no gradient in the synchronising backward contributes what it has
//   accumulated under no_sync (its .grad(), possibly nothing: zero). Unless allowed, a parameter with no gradient
//   at all is an error naming it. When allowed, the ranks also combine a "used" flag per parameter (one small
//   all-reduce): a parameter no rank used keeps an undefined .grad(), and optimizers skip it, as in PyTorch.
// - **An exception during backward** (in a node, a hook or the collective) leaves the reducer ready for the next
//   backward: the collectives already launched are waited for, and the bucket state is reset.
//
// Communication arithmetic: a bucket of n elements costs one collective of n elements; its latency overlaps with
// the backward of the layers before it, except for the last bucket (the embeddings), whose collective is exposed.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/bucketing.h"
#include "dist/process_group.h"

namespace minidl::dist {

// The collective run on bucket `bucket`'s flat (padded) buffer once all of its gradients are in: all_reduce for
// DDP, reduce_scatter into the rank's shard for ZeRO-2/3. Called on the communication thread, in bucket order.
using BucketCollective = std::function<std::shared_ptr<Work>(ProcessGroup& group, size_t bucket, Tensor& buffer)>;

struct ReducerOptions {
  BucketCaps caps;
  // A parameter without any gradient in a synchronising backward is an error naming it, unless this is set.
  bool allow_unused_parameters = false;
  // ZeRO-2: a bucket's buffer exists only while it is needed. It is allocated when the first gradient of a
  // synchronising backward arrives for it and released (with the parameters' .grad() views, which become
  // undefined) as soon as its collective has completed — checked at every later gradient hook and at the end of
  // backward — so at most the buckets still waiting for gradients or in flight hold full gradients. The collective
  // must therefore leave its result outside the buffer (a reduce-scatter into a separate shard). Under no_sync the
  // gradients accumulate in ordinary tensors, copied into the bucket when the synchronising backward reaches them.
  bool release_buffers = false;
  // An explicit bucket assignment (ZeRO-3: one bucket per transformer block, dist/zero3.h) over the parameters
  // that require grad, in their order; empty: assign_buckets(caps).
  std::vector<BucketSpec> buckets;
  // Called on the main thread when a synchronising backward begins (its first gradient), before anything is
  // reduced; an exception from it ends that backward (ZeRO checks that the last step's parameters were gathered).
  std::function<void()> before_sync_backward;
};

// Time spent in the last synchronised backward, in milliseconds.
struct ReducerStats {
  double comm_ms = 0;          // the communication thread's time in the collectives
  double exposed_comm_ms = 0;  // time the main thread waited for them at the end of backward
  int buckets = 0;
};

class Reducer {
 public:
  // `params`: (name, parameter) pairs; parameters that do not require grad are left out. All parameters must be
  // contiguous and on the group's device.
  Reducer(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroup& group, BucketCollective collective,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  ProcessGroup& group() { return group_; }
  const std::vector<BucketSpec>& buckets() const { return buckets_; }
  // Bucket b's flat buffer: buckets()[b].numel elements of gradients, then zero padding up to a multiple of the
  // group size (undefined between backwards with release_buffers).
  Tensor& buffer(size_t bucket) { return state_[bucket].buffer; }
  int64_t padded_numel(size_t bucket) const;
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Tensor>& params() const { return params_; }
  const ReducerStats& last_step() const { return stats_; }

  // While a NoSyncGuard lives, backward only accumulates local gradients; the next backward outside one reduces
  // what was accumulated.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : r_(r), prev_(r.sync_) { r.sync_ = false; }
    ~NoSyncGuard() { r_.sync_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& r_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool sync() const { return sync_; }

  // Runs fn on the communication thread after everything queued before it. The collectives of one group must be
  // issued in the same order on every rank, so ZeRO-3 queues its parameter all-gathers here, between the buckets'
  // reduce-scatters, from the main thread's (rank-independent) order of hooks. The future rethrows fn's exception.
  std::shared_future<void> run_on_comm_thread(std::function<void()> fn);

 private:
  struct Bucket {
    Tensor buffer;
    std::shared_ptr<Work> work;  // its collective in this backward, until the end of backward waits on it
    int pending = 0;             // gradients still to arrive in this backward
    bool launched = false;
    bool done = false;  // the communication thread has issued it
  };
  struct Pass;  // one synchronising backward: its end (or its abandonment by an exception) resets the state

  void begin_backward();
  void on_grad_ready(size_t param, Tensor& grad);
  // Takes param's gradient into its bucket slot (a no-op once .grad() is the slot view) and counts it.
  void adopt(size_t param);
  void launch_ready_buckets();
  void finish_backward();
  void allocate(size_t bucket);
  // release_buffers: drops the buffers whose collective has completed; all: every buffer (after drain()).
  void release_finished(bool all);
  void drain();  // waits for every launched collective (used on success and after an exception)
  void reset();
  void comm_loop();
  Tensor slot(size_t param) const;  // the parameter's span of its bucket, shaped like the parameter

  ProcessGroup& group_;
  BucketCollective collective_;
  ReducerOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<BucketSpec> buckets_;
  std::vector<size_t> bucket_of_, slot_of_;  // param -> bucket, param -> index within the bucket
  std::vector<Bucket> state_;
  std::vector<bool> ready_;
  size_t next_launch_ = 0;  // buckets [0, next_launch_) are launched in this backward
  bool sync_ = true;
  std::weak_ptr<Pass> pass_;  // alive while a synchronising backward is in progress
  ReducerStats stats_;
  std::shared_ptr<Reducer*> self_;  // what the parameters' hooks point at (they hold a weak_ptr)

  // The communication thread and its queue.
  std::mutex mu_;
  std::condition_variable cv_;
  struct Task {
    size_t bucket = 0;
    std::shared_ptr<std::packaged_task<void()>> fn;  // set: run_on_comm_thread's task instead of a bucket
  };
  std::deque<Task> queue_;
  bool stop_ = false;
  double comm_ms_ = 0;
  std::exception_ptr comm_error_;
  std::thread comm_thread_;
};

}  // namespace minidl::dist
