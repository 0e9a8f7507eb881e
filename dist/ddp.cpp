#include "dist/ddp.h"

#include <chrono>

#include "autograd/node.h"

namespace minidl::dist {

struct DistributedDataParallel::Shared {
  DistributedDataParallel* ddp;
};

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, DDPOptions options)
    : module_(module), group_(group), options_(options) {
  std::vector<ParamSpec> specs;
  for (auto& [name, p] : module.named_parameters()) {
    if (!p.requires_grad()) continue;
    MINIDL_CHECK(p.is_contiguous(), "DDP: parameter ", name, " is not contiguous");
    MINIDL_CHECK(p.device() == group.device(), "DDP: parameter ", name, " is on ", p.device(), ", but the ",
                 group.name(), " process group serves ", group.device());
    names_.push_back(name);
    params_.push_back(p);
    specs.push_back({p.numel(), p.dtype()});
  }
  buckets_ = assign_buckets(specs, options.caps);
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  state_.resize(buckets_.size());
  {
    MemoryTagGuard tag(MemTag::kComm);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      state_[b].buffer = Tensor::zeros({buckets_[b].numel}, buckets_[b].dtype, group.device());
      for (size_t s = 0; s < buckets_[b].params.size(); ++s) {
        bucket_of_[buckets_[b].params[s]] = b;
        slot_of_[buckets_[b].params[s]] = s;
      }
    }
  }
  ready_.assign(params_.size(), false);

  if (options.broadcast_at_start) {
    // Every rank starts from rank 0's weights (and buffers), whatever its own initialisation was.
    for (Tensor& p : params_) group.broadcast(p, 0)->wait();
    for (auto& [name, t] : module.named_buffers()) group.broadcast(t, 0)->wait();
  }

  shared_ = std::make_shared<Shared>(Shared{this});
  std::weak_ptr<Shared> weak = shared_;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].register_grad_ready_hook([weak, i](Tensor& grad) {
      if (auto s = weak.lock()) s->ddp->on_grad_ready(i, grad);
    });
  comm_thread_ = std::thread([this] { comm_loop(); });
}

DistributedDataParallel::~DistributedDataParallel() {
  shared_.reset();  // hooks left on the parameters become no-ops
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  comm_thread_.join();
}

void DistributedDataParallel::on_grad_ready(size_t param, const Tensor& grad) {
  if (!sync_) return;
  if (!in_backward_) {
    // First gradient of a synchronised backward: reset the buckets and arrange to wait for them at its end.
    in_backward_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    for (size_t b = 0; b < state_.size(); ++b) {
      state_[b].pending = int(buckets_[b].params.size());
      state_[b].launched = state_[b].done = false;
    }
    comm_ms_ = 0;
    autograd::queue_callback([this] { finish_backward(); });
  }
  MINIDL_ASSERT(!ready_[param], "gradient of ", names_[param], " became ready twice in one backward");
  ready_[param] = true;
  size_t b = bucket_of_[param];
  const BucketSpec& spec = buckets_[b];
  MINIDL_ASSERT(grad.is_contiguous() && grad.dtype() == spec.dtype);
  slot(param).copy_(flat(grad));
  if (--state_[b].pending == 0) launch(b);
}

void DistributedDataParallel::launch(size_t bucket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_[bucket].launched = true;
    queue_.push_back(bucket);
  }
  cv_.notify_all();
}

void DistributedDataParallel::comm_loop() {
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      b = queue_.front();
      queue_.pop_front();
    }
    auto t0 = Clock::now();
    std::shared_ptr<Work> work;
    try {
      work = group_.all_reduce(state_[b].buffer, ReduceOp::kAvg);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!comm_error_) comm_error_ = std::current_exception();
    }
    double ms = ms_since(t0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      comm_ms_ += ms;
      state_[b].work = std::move(work);
      state_[b].done = true;
    }
    cv_.notify_all();
  }
}

void DistributedDataParallel::finish_backward() {
  in_backward_ = false;
  // Parameters that got no gradient: an error unless allowed, then a zero contribution to the average.
  std::string unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.allow_unused_parameters) {
      unused += (unused.empty() ? "" : ", ") + names_[i];
      continue;
    }
    size_t b = bucket_of_[i];
    slot(i).zero_();
    ready_[i] = true;
    if (--state_[b].pending == 0) launch(b);
  }
  MINIDL_CHECK(unused.empty(), "DDP: these parameters received no gradient in this backward: ", unused,
               ". Every rank must use every parameter, or construct DistributedDataParallel with "
               "allow_unused_parameters = true");

  auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] {
      for (const Bucket& s : state_)
        if (!s.done) return false;
      return true;
    });
    if (comm_error_) std::rethrow_exception(std::exchange(comm_error_, nullptr));
  }
  // On the CPU the all-reduces have finished by now; on a CUDA device this orders the compute stream after them.
  for (Bucket& s : state_) std::exchange(s.work, nullptr)->wait();
  stats_ = {comm_ms_, ms_since(t0), int(state_.size())};
  // The averaged gradients replace the local ones.
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) {
      MemoryTagGuard tag(MemTag::kGrads);
      g = Tensor::empty(params_[i].shape(), params_[i].dtype(), params_[i].device());
      params_[i].set_grad(g);
    }
    flat(g).copy_(slot(i));
  }
}

Tensor DistributedDataParallel::flat(const Tensor& t) { return t.as_strided({t.numel()}, {1}, 0); }

Tensor DistributedDataParallel::slot(size_t param) {
  const BucketSpec& spec = buckets_[bucket_of_[param]];
  return state_[bucket_of_[param]].buffer.as_strided({params_[param].numel()}, {1}, spec.offsets[slot_of_[param]]);
}

}  // namespace minidl::dist
