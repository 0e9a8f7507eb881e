#include "dist/reducer.h"

#include <chrono>

#include "autograd/node.h"
#include "core/trace.h"
#include "dist/flight_recorder.h"
#include "dist/shard.h"

namespace minidl::dist {

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Held only by the end-of-backward callback queued with autograd. If backward throws, the engine drops its
// callbacks without running them; the token's destructor then puts the reducer back in order for the next step.
struct Reducer::Pass {
  Reducer* reducer = nullptr;
  bool finished = false;
  ~Pass() {
    if (finished || !reducer) return;
    try {
      reducer->drain();
    } catch (...) {  // the exception already unwinding is the one to report
    }
    reducer->release_finished(/*all=*/true);
    reducer->reset();
  }
};

Reducer::Reducer(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroup& group,
                 BucketCollective collective, ReducerOptions options)
    : group_(group), collective_(std::move(collective)), options_(options) {
  std::vector<ParamSpec> specs;
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    MINIDL_CHECK(p.is_contiguous(), "Reducer: parameter ", name, " is not contiguous");
    MINIDL_CHECK(p.device() == group.device(), "Reducer: parameter ", name, " is on ", p.device(), ", but the ",
                 group.name(), " process group serves ", group.device());
    names_.push_back(name);
    params_.push_back(p);
    specs.push_back({p.numel(), p.dtype()});
  }
  buckets_ = options.buckets.empty() ? assign_buckets(specs, options.caps) : options.buckets;
  std::vector<int> seen(params_.size(), 0);
  for (const BucketSpec& b : buckets_)
    for (size_t p : b.params)
      MINIDL_CHECK(p < seen.size() && seen[p]++ == 0, "Reducer: parameter ", p,
                   " is out of range or in two of the explicit buckets");
  for (size_t p = 0; p < seen.size(); ++p)
    MINIDL_CHECK(seen[p] == 1, "Reducer: parameter ", names_[p], " is in none of the explicit buckets");
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  state_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!options.release_buffers) allocate(b);
    for (size_t s = 0; s < buckets_[b].params.size(); ++s) {
      bucket_of_[buckets_[b].params[s]] = b;
      slot_of_[buckets_[b].params[s]] = s;
    }
  }
  ready_.assign(params_.size(), false);

  self_ = std::make_shared<Reducer*>(this);
  std::weak_ptr<Reducer*> weak = self_;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].register_grad_ready_hook([weak, i](Tensor& grad) {
      if (auto self = weak.lock()) (*self)->on_grad_ready(i, grad);
    });
  comm_thread_ = std::thread([this] { comm_loop(); });
}

Reducer::~Reducer() {
  self_.reset();  // hooks left on the parameters become no-ops
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  comm_thread_.join();
}

int64_t Reducer::padded_numel(size_t bucket) const { return dist::padded_numel(buckets_[bucket].numel, group_.size()); }

void Reducer::allocate(size_t b) {
  MemoryTagGuard tag(MemTag::kGrads);  // the buckets are the gradients' storage
  state_[b].buffer = Tensor::zeros({padded_numel(b)}, buckets_[b].dtype, group_.device());
}

void Reducer::release_finished(bool all) {
  if (!options_.release_buffers) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < state_.size(); ++b) {
    Bucket& s = state_[b];
    if (!s.buffer.defined() || (!all && (!s.done || (s.work && !s.work->is_completed())))) continue;
    if (auto w = std::exchange(s.work, nullptr)) w->wait();
    for (size_t p : buckets_[b].params) params_[p].set_grad(Tensor());
    s.buffer = Tensor();
  }
}

Tensor Reducer::slot(size_t param) const {
  const Tensor& p = params_[param];
  return state_[bucket_of_[param]].buffer.as_strided(p.shape(), contiguous_strides(p.shape()),
                                                     buckets_[bucket_of_[param]].offsets[slot_of_[param]]);
}

void Reducer::begin_backward() {
  if (options_.before_sync_backward) options_.before_sync_backward();
  reset();
  auto pass = std::make_shared<Pass>();
  pass->reducer = this;
  pass_ = pass;  // weak: the callback owns the pass, so dropping the callback ends it
  autograd::queue_callback([pass]() {
    pass->finished = true;
    pass->reducer->finish_backward();
  });
}

void Reducer::reset() {
  pass_.reset();
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < state_.size(); ++b) {
    state_[b].pending = int(buckets_[b].params.size());
    state_[b].launched = state_[b].done = false;
    state_[b].work = nullptr;
  }
  next_launch_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  comm_ms_ = 0;
  comm_error_ = nullptr;
}

void Reducer::on_grad_ready(size_t param, Tensor& grad) {
  if (!sync_) return;
  if (pass_.expired()) begin_backward();  // the first gradient of a synchronising backward
  MINIDL_ASSERT(!ready_[param], "gradient of ", names_[param], " became ready twice in one backward");
  MINIDL_ASSERT(grad.same(params_[param].grad()), "the hook's gradient is not ", names_[param], "'s .grad()");
  adopt(param);
  launch_ready_buckets();
  release_finished(/*all=*/false);
}

void Reducer::adopt(size_t param) {
  Tensor& p = params_[param];
  if (!state_[bucket_of_[param]].buffer.defined()) allocate(bucket_of_[param]);
  Tensor g = p.grad(), view = slot(param);
  const bool is_view = g.defined() && g.shares_storage(view) && g.raw_device_data() == view.raw_device_data();
  if (!is_view) {
    if (g.defined()) {
      MINIDL_ASSERT(g.is_contiguous() && g.dtype() == p.dtype() && g.shape() == p.shape());
      view.copy_(g);
    } else {
      view.zero_();
    }
    p.set_grad(view);  // from now on autograd accumulates into the bucket
  }
  ready_[param] = true;
  --state_[bucket_of_[param]].pending;
}

void Reducer::launch_ready_buckets() {
  size_t first = next_launch_;
  while (next_launch_ < state_.size() && state_[next_launch_].pending == 0) state_[next_launch_++].launched = true;
  if (next_launch_ == first) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = first; b < next_launch_; ++b) queue_.push_back({b, nullptr});
  }
  cv_.notify_all();
}

void Reducer::comm_loop() {
  trace::name_thread("comm");
  trace::set_device_timing(false);  // this thread's spans launch on the backend's stream, which times them itself
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task.fn) {
      (*task.fn)();  // a packaged task: its exception goes to its future
      continue;
    }
    const size_t b = task.bucket;
    auto t0 = Clock::now();
    std::shared_ptr<Work> work;
    std::exception_ptr error;
    try {
      std::string label = "bucket ";
      label += std::to_string(b);
      const trace::Span span(label);
      const CallSite site(std::move(label));
      work = collective_(group_, b, state_[b].buffer);
    } catch (...) { error = std::current_exception(); }
    double ms = ms_since(t0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      comm_ms_ += ms;
      if (error && !comm_error_) comm_error_ = error;
      state_[b].work = std::move(work);
      state_[b].done = true;
    }
    cv_.notify_all();
  }
}

std::shared_future<void> Reducer::run_on_comm_thread(std::function<void()> fn) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(fn));
  std::shared_future<void> done = task->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({0, std::move(task)});
  }
  cv_.notify_all();
  return done;
}

void Reducer::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] {
    for (const Bucket& s : state_)
      if (s.launched && !s.done) return false;
    return true;
  });
  std::exception_ptr error = std::exchange(comm_error_, nullptr);
  lock.unlock();
  // On the CPU the collectives have finished by now; on a CUDA device this orders the compute stream after them.
  for (Bucket& s : state_)
    if (auto w = std::exchange(s.work, nullptr)) w->wait();
  if (error) std::rethrow_exception(error);
}

void Reducer::finish_backward() {
  // Parameters that got no gradient in this backward contribute what they accumulated under no_sync, or zero.
  std::vector<uint8_t> used(params_.size(), 1);
  std::string unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!params_[i].grad().defined()) {
      used[i] = 0;
      if (!options_.allow_unused_parameters) unused += (unused.empty() ? "" : ", ") + names_[i];
    }
  }
  auto t0 = Clock::now();
  const trace::Span exposed("wait for buckets");  // the communication the backward could not hide
  try {
    MINIDL_CHECK(unused.empty(), "DDP: these parameters received no gradient in this backward: ", unused,
                 ". Every rank must use every parameter, or construct the reducer with "
                 "allow_unused_parameters = true");
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      Tensor kept = params_[i].grad();
      adopt(i);
      if (!used[i]) params_[i].set_grad(kept);  // undefined until we know whether another rank used it
    }
    launch_ready_buckets();
    drain();
  } catch (...) {
    try {
      drain();
    } catch (...) {}
    release_finished(/*all=*/true);
    reset();
    throw;
  }
  stats_ = {comm_ms_, ms_since(t0), int(state_.size())};
  if (options_.allow_unused_parameters) {
    // One flag per parameter, max over ranks: a parameter no rank used keeps an undefined gradient.
    Tensor flags = Tensor::from_vector(std::vector<int32_t>(used.begin(), used.end()), {int64_t(used.size())});
    Tensor on_device = flags.to(group_.device());
    group_.all_reduce(on_device, ReduceOp::kMax)->wait();
    std::vector<double> any = on_device.to_vector();
    for (size_t i = 0; i < params_.size(); ++i)
      if (!used[i] && any[i] > 0) params_[i].set_grad(slot(i));  // another rank used it: the reduced value
  }
  release_finished(/*all=*/true);
  reset();
}

}  // namespace minidl::dist
