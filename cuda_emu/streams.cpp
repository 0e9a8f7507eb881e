// Deferred streams: the async mode of the emulator's streams (contract in emulator.h, objects in stream_state.h).
//
// In async mode nothing queued on a stream runs when it is queued. Each stream has a FIFO of operations (kernels,
// copies, memsets, library work through minidl::emu::enqueue, event records, and event waits as empty operations
// that carry a dependency on the record they wait for). Work runs only when the host needs it: a synchronisation
// (of a stream, an event or the device, a query, a synchronous copy or memset, cudaFree) names the operations it
// needs, and the calling thread runs exactly those and what they transitively wait for, no more. So an operation
// that nothing waits for runs late (after everything queued after it on other streams, if a later wait pulls those
// first), and an operation whose missing wait would have held it back runs early.
//
// Order, chosen to expose a missing cudaStreamWaitEvent deterministically: while the needed work is spread over
// several streams, the next operation comes from a stream that the caller is NOT waiting on (newest stream first),
// and the streams waited on run last. So a consumer on a side stream that forgot to wait for the main stream runs
// before the main stream's producer (it reads stale data), and a consumer on the main stream that forgot to wait
// for a side stream's producer never pulls that producer at all.
//
// Implicit ordering as in CUDA: the legacy default stream (null, cudaStreamLegacy; cudaStreamPerThread shares it
// here) waits for all earlier work of blocking streams and they for its; cudaStreamNonBlocking streams are ordered
// with nothing but their own events.
//
// Threads: one mutex guards every queue and event; a thread runs an operation with the mutex released, one
// operation per stream at a time, and other threads that need the same stream wait for it. Work from any host
// thread (the reducer's communication thread) may run on any other, as on a GPU. An emulated NCCL operation blocks
// the thread that runs it until the peer ranks run theirs. Unlike a GPU, nothing runs it while its rank's host is
// blocked elsewhere: a rank that waits in a host-side MPI call for a peer that waits for the collective hangs
// (minidl's tests do not; on a GPU the same program would not hang).
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"
#include "cuda_emu/stream_state.h"

namespace minidl::emu::detail {

struct Dependency {
  std::shared_ptr<Queue> queue;
  uint64_t seq;  // done once queue->done >= seq
};

struct Operation {
  uint64_t seq;
  std::function<cudaError_t()> work;  // empty: an event wait
  std::vector<Dependency> after;
};

struct Queue {
  bool blocking;
  std::deque<Operation> pending;
  uint64_t queued = 0, done = 0;  // the seq of the last operation queued, and of the last completed
  bool running = false;           // a thread runs its front operation
};

namespace {

struct Streams {
  std::mutex mutex;
  std::condition_variable progress;          // an operation completed
  std::vector<std::weak_ptr<Queue>> queues;  // creation order
  int running = 0;
  std::shared_ptr<Queue> legacy;
};

std::shared_ptr<Queue> make_queue_locked(Streams& s, bool blocking) {
  auto queue = std::make_shared<Queue>();
  queue->blocking = blocking;
  std::erase_if(s.queues, [](const std::weak_ptr<Queue>& q) { return q.expired(); });
  s.queues.push_back(queue);
  return queue;
}

Streams& streams() {
  static Streams* s = [] {
    auto* made = new Streams;  // never destroyed: work may be queued from static destructors
    made->legacy = make_queue_locked(*made, true);
    return made;
  }();
  return *s;
}

bool async_mode() { return options().streams == StreamMode::kAsync; }

// The handles cudaStreamLegacy (1) and cudaStreamPerThread (2) and the null stream are not CUstream_st objects.
const std::shared_ptr<Queue>& queue_of(Streams& s, cudaStream_t stream) {
  return reinterpret_cast<uintptr_t>(stream) > 2 ? stream->queue : s.legacy;
}

bool reached(const Dependency& d) { return d.queue->done >= d.seq; }

uint64_t push_locked(Streams& s, const std::shared_ptr<Queue>& queue, std::function<cudaError_t()> work,
                     std::vector<Dependency> after) {
  const auto add = [&](const std::shared_ptr<Queue>& q) {
    if (q != queue && q->queued > q->done) after.push_back({q, q->queued});
  };
  if (queue == s.legacy) {
    for (const std::weak_ptr<Queue>& weak : s.queues)
      if (const std::shared_ptr<Queue> q = weak.lock(); q && q->blocking) add(q);
  } else if (queue->blocking) {
    add(s.legacy);
  }
  std::erase_if(after, reached);
  queue->pending.push_back({++queue->queued, std::move(work), std::move(after)});
  return queue->queued;
}

// Runs, on the calling thread, what `goals` need (module comment); returns the first error of what it ran.
cudaError_t drive(Streams& s, std::unique_lock<std::mutex>& lock, const std::vector<Dependency>& goals) {
  std::unordered_map<Queue*, uint64_t> needed;  // per queue: run it up to this seq
  std::vector<Dependency> todo(goals);
  while (!todo.empty()) {
    const Dependency d = todo.back();
    todo.pop_back();
    uint64_t& limit = needed[d.queue.get()];
    if (d.seq <= limit || reached(d)) continue;
    for (const Operation& op : d.queue->pending)
      if (op.seq > limit && op.seq <= d.seq) todo.insert(todo.end(), op.after.begin(), op.after.end());
    limit = d.seq;
  }
  const auto is_goal = [&](const Queue* q) {
    return std::any_of(goals.begin(), goals.end(), [&](const Dependency& g) { return g.queue.get() == q; });
  };
  const auto runnable = [&](const std::shared_ptr<Queue>& q, bool goal) {
    if (!q || q->running || q->pending.empty() || is_goal(q.get()) != goal) return false;
    const auto it = needed.find(q.get());
    const Operation& front = q->pending.front();
    return it != needed.end() && front.seq <= it->second &&
           std::all_of(front.after.begin(), front.after.end(), reached);
  };
  cudaError_t first_error = cudaSuccess;
  while (!std::all_of(goals.begin(), goals.end(), reached)) {
    std::shared_ptr<Queue> next;
    for (bool goal : {false, true}) {  // streams not waited on first, newest first
      for (auto it = s.queues.rbegin(); it != s.queues.rend() && !next; ++it)
        if (std::shared_ptr<Queue> q = it->lock(); runnable(q, goal)) next = std::move(q);
    }
    if (!next) {
      if (s.running == 0) fatal("deferred streams: nothing can run, yet the work waited for has not completed");
      s.progress.wait(lock);
      continue;
    }
    Operation op = std::move(next->pending.front());
    next->pending.pop_front();
    next->running = true;
    ++s.running;
    lock.unlock();
    cudaError_t status = cudaSuccess;
    try {
      if (op.work) status = op.work();
    } catch (...) {
      lock.lock();
      next->running = false;
      next->done = op.seq;
      --s.running;
      s.progress.notify_all();
      throw;
    }
    const uint64_t seq = op.seq;
    op = Operation{};  // release what the work captured outside the lock
    lock.lock();
    next->running = false;
    next->done = seq;
    --s.running;
    s.progress.notify_all();
    if (status != cudaSuccess && first_error == cudaSuccess) first_error = status;
  }
  if (first_error != cudaSuccess) set_last_error(first_error);
  return first_error;
}

}  // namespace

std::shared_ptr<Queue> make_queue(bool blocking) {
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  return make_queue_locked(s, blocking);
}

cudaError_t submit(cudaStream_t stream, std::function<cudaError_t()> work) {
  if (!async_mode()) {
    const cudaError_t status = work();
    if (status != cudaSuccess) set_last_error(status);
    return status;
  }
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  push_locked(s, queue_of(s, stream), std::move(work), {});
  return cudaSuccess;
}

cudaError_t record_event(CUevent_st* event, cudaStream_t stream) {
  const std::shared_ptr<EventState>& state = event->state;
  if (!async_mode() || is_capturing(stream)) {
    std::lock_guard lock(streams().mutex);
    state->queue.reset();
    state->time = std::chrono::steady_clock::now();
    state->recorded = true;
    return cudaSuccess;
  }
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  const std::shared_ptr<Queue>& queue = queue_of(s, stream);
  const uint64_t seq = queue->queued + 1;
  push_locked(s, queue,
              [state, queue = queue.get(), seq] {
                const auto now = std::chrono::steady_clock::now();
                std::lock_guard inner(streams().mutex);
                if (state->queue.get() == queue && state->seq == seq) {  // still the event's latest record
                  state->time = now;
                  state->recorded = true;
                }
                return cudaSuccess;
              },
              {});
  state->queue = queue;
  state->seq = seq;
  state->recorded = false;
  return cudaSuccess;
}

cudaError_t wait_event(cudaStream_t stream, const CUevent_st* event) {
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  const EventState& state = *event->state;
  const std::shared_ptr<Queue>& queue = queue_of(s, stream);
  if (!state.queue || state.queue == queue || state.queue->done >= state.seq) return cudaSuccess;
  push_locked(s, queue, {}, {{state.queue, state.seq}});
  return cudaSuccess;
}

cudaError_t synchronize_stream(cudaStream_t stream) {
  Streams& s = streams();
  std::unique_lock lock(s.mutex);
  const std::shared_ptr<Queue>& queue = queue_of(s, stream);
  return drive(s, lock, {{queue, queue->queued}});
}

cudaError_t synchronize_event(const CUevent_st* event) {
  Streams& s = streams();
  std::unique_lock lock(s.mutex);
  const EventState& state = *event->state;
  if (!state.queue) return cudaSuccess;
  return drive(s, lock, {{state.queue, state.seq}});
}

cudaError_t synchronize_device() {
  Streams& s = streams();
  std::unique_lock lock(s.mutex);
  std::vector<Dependency> all;
  for (const std::weak_ptr<Queue>& weak : s.queues)
    if (std::shared_ptr<Queue> q = weak.lock()) all.push_back({q, q->queued});
  return drive(s, lock, all);
}

cudaError_t event_time(const CUevent_st* event, std::chrono::steady_clock::time_point* time) {
  std::lock_guard lock(streams().mutex);
  *time = event->state->time;
  if (event->state->recorded) return cudaSuccess;
  return event->state->queue ? cudaErrorNotReady : cudaErrorInvalidResourceHandle;
}

}  // namespace minidl::emu::detail

bool minidl::emu::defers(cudaStream_t stream) { return is_capturing(stream) || detail::async_mode(); }
