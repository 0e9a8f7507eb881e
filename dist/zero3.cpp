#include "dist/zero3.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "autograd/autocast.h"
#include "core/memory.h"
#include "core/trace.h"
#include "dist/shard.h"
#include "ops/cast.h"

namespace minidl::dist {

namespace {

BucketSpec make_bucket(const std::vector<size_t>& params, const std::vector<int64_t>& numel) {
  BucketSpec b{DType::f32, {}, {}, 0};
  for (size_t p : params) {
    b.params.push_back(p);
    b.offsets.push_back(b.numel);
    b.numel += numel[p];
  }
  return b;
}

Tensor flat_view(const Tensor& flat, int64_t offset, int64_t numel) { return flat.as_strided({numel}, {1}, offset); }

ReducerOptions reducer_options(const nn::BlockModule& model, std::function<void()> before_sync_backward) {
  ReducerOptions r;
  r.before_sync_backward = std::move(before_sync_backward);
  r.release_buffers = true;  // stage 2's gradient memory: a bucket lives from its first gradient to its scatter
  r.buckets = block_buckets(model);
  return r;
}

}  // namespace

std::vector<BucketSpec> block_buckets(const nn::BlockModule& model) {
  // The units are the model's: each block's parameters, as the model lists them (BlockModule::block_parameters).
  const int64_t first_block = model.first_block(), last_block = first_block + model.num_blocks();
  std::unordered_map<const TensorImpl*, int64_t> block_of;
  for (int64_t b = first_block; b < last_block; ++b) {
    bool trained = false;
    for (const Tensor& p : model.block_parameters(b)) {
      const auto [it, fresh] = block_of.emplace(p.impl(), b);
      MINIDL_CHECK(fresh, "ZeRO-3: a parameter of block ", b, " is also a parameter of block ", it->second,
                   " (BlockModule::block_parameters must name each parameter in one block)");
      trained |= p.requires_grad();
    }
    MINIDL_CHECK(trained, "ZeRO-3: block ", b,
                 " has no parameter that requires grad "
                 "(BlockModule::block_parameters names none): a block is the unit ZeRO-3 gathers and shards");
  }
  std::vector<std::vector<size_t>> per_block(size_t(last_block - first_block));
  std::vector<size_t> persistent;
  std::vector<int64_t> numel;
  for (const Tensor& p : model.parameters()) {
    if (!p.requires_grad()) continue;
    const size_t index = numel.size();
    numel.push_back(p.numel());
    auto it = block_of.find(p.impl());
    (it == block_of.end() ? persistent : per_block[size_t(it->second - first_block)]).push_back(index);
  }
  std::vector<BucketSpec> buckets;
  for (auto it = per_block.rbegin(); it != per_block.rend(); ++it) {
    std::reverse(it->begin(), it->end());
    buckets.push_back(make_bucket(*it, numel));
  }
  std::reverse(persistent.begin(), persistent.end());
  if (!persistent.empty()) buckets.push_back(make_bucket(persistent, numel));
  return buckets;
}

ZeroStage3::ZeroStage3(nn::BlockModule& model, ProcessGroup& group, Zero3Options options)
    : model_(model),
      rank_(group.rank()),
      world_(group.size()),
      first_block_(model.first_block()),
      last_block_(model.first_block() + model.num_blocks()),
      reducer_(
          model.named_parameters(), group,
          [this](ProcessGroup& g, size_t b, Tensor& bucket) {
            const trace::Span span(trace::enabled() ? "reduce-scatter bucket " + std::to_string(b) : "");
            return g.reduce_scatter(grad_shards_[b], bucket, ReduceOp::kAvg);
          },
          reducer_options(model, reduction_check())) {
  if (options.broadcast_at_start) {
    for (auto& [name, p] : model.named_parameters()) group.broadcast(p, 0)->wait();
    for (auto& [name, t] : model.named_buffers()) group.broadcast(t, 0)->wait();
  }
  const std::vector<Tensor>& params = reducer_.params();
  const size_t n_blocks = size_t(last_block_ - first_block_);
  units_.resize(reducer_.buckets().size());
  MINIDL_ASSERT(units_.size() == n_blocks || units_.size() == n_blocks + 1);
  for (size_t b = 0; b < reducer_.buckets().size(); ++b) {
    const BucketSpec& spec = reducer_.buckets()[b];
    MINIDL_CHECK(spec.dtype == DType::f32, "ZeRO-3: expected f32 parameters (the optimizer's dtype), got ", spec.dtype,
                 " for ", reducer_.names()[spec.params.front()]);
    // Unit u: blocks in model order, then the persistent unit; bucket b: latest block first.
    const size_t u = b < n_blocks ? n_blocks - 1 - b : b;
    Unit& unit = units_[u];
    unit.bucket = b;
    const int64_t padded = reducer_.padded_numel(b), shard = padded / world_, first = rank_ * shard;
    {
      MemoryTagGuard tag(MemTag::kParams);
      unit.flat = Tensor::zeros({padded}, spec.dtype, group.device());
      for (size_t s = 0; s < spec.params.size(); ++s) {
        Tensor p = params[spec.params[s]];  // a handle: set_data re-points every holder of this parameter
        Tensor view = unit.flat.as_strided(p.shape(), contiguous_strides(p.shape()), spec.offsets[s]);
        view.copy_(p.detach());
        p.set_data(view);
      }
      if (b < n_blocks) {
        unit.shard = flat_view(unit.flat, first, shard).clone();
        unit.flat.impl()->storage->release();  // gathered when the block runs
      } else {
        unit.shard = flat_view(unit.flat, first, shard);  // persistent: whole on every rank
        unit.gathered = true;
      }
    }
    {
      MemoryTagGuard tag(MemTag::kGrads);
      grad_shards_.push_back(Tensor::zeros({shard}, spec.dtype, group.device()));
    }
    // The shard cut at parameter boundaries into leaves for the optimizer (as in dist/zero.cpp).
    for (size_t s = 0; s < spec.params.size(); ++s) {
      const int64_t begin = std::max(first, spec.offsets[s]);
      const int64_t end = std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel());
      if (begin >= end) continue;
      Tensor piece = flat_view(unit.shard, begin - first, end - begin);
      piece.set_requires_grad(true);
      piece.set_grad(flat_view(grad_shards_[b], begin - first, end - begin));
      shard_params_.push_back(piece);
      shard_owner_.push_back(spec.params[s]);
      shard_pieces_.push_back({b, s, begin, end - begin});
    }
  }
  // Each block is freed once the last of its parameters' gradients is final.
  self_ = std::make_shared<ZeroStage3*>(this);
  std::weak_ptr<ZeroStage3*> weak = self_;
  for (size_t u = 0; u < n_blocks; ++u)
    for (size_t p : reducer_.buckets()[units_[u].bucket].params) {
      Tensor param = reducer_.params()[p];  // a handle to the same parameter
      param.register_grad_ready_hook([weak, block = first_block_ + int64_t(u)](Tensor&) {
        if (auto self = weak.lock()) (*self)->on_block_grad(block);
      });
    }
  claim_updates(params, "dist::ZeroStage3 (ZeRO-3)");
  model.set_block_hooks(this);
}

ZeroStage3::~ZeroStage3() {
  self_.reset();
  model_.set_block_hooks(nullptr);
  for (Unit& u : units_)
    if (u.pending.valid()) u.pending.wait();
}

ZeroStage3::Unit& ZeroStage3::block_unit(int64_t block) {
  MINIDL_ASSERT(block >= first_block_ && block < last_block_, "ZeRO-3: block ", block, " is not held here");
  return units_[size_t(block - first_block_)];
}

void ZeroStage3::prefetch(int64_t block) {
  if (block < first_block_ || block >= last_block_) return;
  Unit& u = block_unit(block);
  if (u.gathered || u.pending.valid()) return;
  ++block_gathers_;
  u.pending = reducer_.run_on_comm_thread([this, &u, block] {
    const trace::Span span(trace::enabled() ? "all-gather block " + std::to_string(block) : "");
    MemoryTagGuard tag(MemTag::kParams);  // the gathered block is parameters, whatever the main thread runs
    u.flat.impl()->storage->reallocate(size_t(u.flat.numel()) * dtype_size(u.flat.dtype()));
    reducer_.group().all_gather(u.flat, u.shard)->wait();
  });
}

void ZeroStage3::ensure_gathered(int64_t block) {
  Unit& u = block_unit(block);
  if (u.gathered) return;
  prefetch(block);
  {
    const trace::Span span("wait for all-gather");  // what the prefetch did not hide
    std::exchange(u.pending, {}).get();
  }
  u.gathered = true;
  const DType amp = autograd::autocast_dtype();
  if (amp == DType::f32) return;
  // Stage 3 owns the 16-bit cast: one cast of the gathered block into a buffer freed with it.
  MemoryTagGuard tag(MemTag::kParams);
  if (!u.half.defined() || u.half.dtype() != amp) {
    u.half = ops::cast(u.flat, amp);
    u.half_views.clear();
    const BucketSpec& spec = reducer_.buckets()[u.bucket];
    for (size_t s = 0; s < spec.params.size(); ++s) {
      const Tensor& p = reducer_.params()[spec.params[s]];
      u.half_views.push_back(u.half.as_strided(p.shape(), contiguous_strides(p.shape()), spec.offsets[s]));
    }
  } else {
    u.half.impl()->storage->reallocate(size_t(u.half.numel()) * dtype_size(amp));
    u.half.copy_(u.flat);  // round to nearest even, as the cast autocast would make
  }
  half_dtype_ = amp;
  const BucketSpec& spec = reducer_.buckets()[u.bucket];
  for (size_t s = 0; s < spec.params.size(); ++s)
    autograd::autocast_provide(reducer_.params()[spec.params[s]], u.half_views[s]);
}

void ZeroStage3::release(int64_t block) {
  Unit& u = block_unit(block);
  if (!u.gathered || hold_) return;
  u.gathered = false;
  u.flat.impl()->storage->release();
  if (u.half.defined() && u.half.impl()->storage->data() != nullptr) {
    u.half.impl()->storage->release();
    for (size_t p : reducer_.buckets()[u.bucket].params) autograd::autocast_forget(reducer_.params()[p], half_dtype_);
  }
}

void ZeroStage3::before_block(int64_t block, bool recompute) {
  if (hold_) return;
  ensure_gathered(block);  // a recomputation finds its block gathered by before_block_backward
  if (!recompute) prefetch(block + 1);
}

void ZeroStage3::after_block(int64_t block, bool recompute) {
  if (!recompute) release(block);  // a recomputed block stays for its backward
}

void ZeroStage3::before_block_backward(int64_t block) {
  block_unit(block).grads_left = int(reducer_.buckets()[block_unit(block).bucket].params.size());
  if (hold_) return;
  ensure_gathered(block);
  prefetch(block - 1);
}

void ZeroStage3::on_block_grad(int64_t block) {
  Unit& u = block_unit(block);
  if (--u.grads_left == 0) release(block);
}

void ZeroStage3::hold_full(bool hold) {
  if (hold == hold_) return;
  if (hold) {
    for (int64_t b = first_block_; b < last_block_; ++b) ensure_gathered(b);
    hold_ = true;
  } else {
    hold_ = false;
    for (int64_t b = first_block_; b < last_block_; ++b) release(b);
  }
}

void ZeroStage3::gather_parameters() {
  const trace::Span span("all-gather parameters");
  for (Unit& u : units_) {
    if (size_t(&u - units_.data()) < size_t(last_block_ - first_block_)) {
      // A held block (hold_full) is refreshed from its updated shard; the others gather when they next run.
      if (u.gathered) reducer_.group().all_gather(u.flat, u.shard)->wait();
      continue;
    }
    reducer_.group().all_gather(u.flat, u.shard)->wait();
  }
  end_gather();
}

int64_t ZeroStage3::padded_numel() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.flat.numel();
  return n;
}

int64_t ZeroStage3::persistent_numel() const {
  const size_t n_blocks = size_t(last_block_ - first_block_);
  return units_.size() > n_blocks ? reducer_.buckets()[units_.back().bucket].numel : 0;
}

int64_t ZeroStage3::block_padded_numel(int64_t block) const {
  return units_[size_t(block - first_block_)].flat.numel();
}

}  // namespace minidl::dist
