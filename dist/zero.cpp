#include "dist/zero.h"

#include <algorithm>
#include <unordered_map>

#include "core/memory.h"
#include "core/trace.h"
#include "dist/shard.h"

namespace minidl::dist {

namespace {

ReducerOptions reducer_options(const ZeroOptions& o, std::function<void()> before_sync_backward) {
  ReducerOptions r;
  r.caps = o.caps;
  r.release_buffers = o.stage == 2;
  r.before_sync_backward = std::move(before_sync_backward);
  return r;
}

// A flat view of `numel` elements of `flat` from `offset`: a leaf (as_strided is not recorded by autograd).
Tensor flat_view(const Tensor& flat, int64_t offset, int64_t numel) { return flat.as_strided({numel}, {1}, offset); }

}  // namespace

ZeroDataParallel::ZeroDataParallel(nn::Module& module, ProcessGroup& group, ZeroOptions options)
    : ZeroDataParallel(module.named_parameters(), group, options) {
  if (options.broadcast_at_start)
    for (auto& [name, t] : module.named_buffers()) group.broadcast(t, 0)->wait();
}

ZeroDataParallel::ZeroDataParallel(const std::vector<std::pair<std::string, Tensor>>& named_params, ProcessGroup& group,
                                   ZeroOptions options)
    : options_(options),
      rank_(group.rank()),
      world_(group.size()),
      reducer_(
          named_params, group,
          // The average of the bucket over the group lands in this rank's gradient shard only.
          [this](ProcessGroup& g, size_t b, Tensor& bucket) {
            const trace::Span span(trace::enabled() ? "reduce-scatter bucket " + std::to_string(b) : "");
            return g.reduce_scatter(grad_shards_[b], bucket, ReduceOp::kAvg);
          },
          reducer_options(options, reduction_check())) {
  MINIDL_CHECK(options.stage == 1 || options.stage == 2, "ZeRO: expected stage 1 or 2, got ", options.stage,
               " (stage 3 is dist::ZeroStage3)");
  if (options.broadcast_at_start)
    for (const auto& [name, p] : named_params) {
      Tensor handle = p;
      group.broadcast(handle, 0)->wait();
    }
  const std::vector<Tensor>& params = reducer_.params();
  for (size_t b = 0; b < reducer_.buckets().size(); ++b) {
    const BucketSpec& spec = reducer_.buckets()[b];
    MINIDL_CHECK(spec.dtype == DType::f32, "ZeRO: expected f32 parameters (the optimizer's dtype), got ", spec.dtype,
                 " for ", reducer_.names()[spec.params.front()]);
    Tensor flat;
    {
      MemoryTagGuard tag(MemTag::kParams);
      flat = Tensor::zeros({reducer_.padded_numel(b)}, spec.dtype, group.device());
    }
    for (size_t s = 0; s < spec.params.size(); ++s) {
      Tensor p = params[spec.params[s]];  // a handle: set_data re-points every holder of this parameter
      Tensor view = flat.as_strided(p.shape(), contiguous_strides(p.shape()), spec.offsets[s]);
      view.copy_(p.detach());
      p.set_data(view);
    }
    flat_params_.push_back(flat);
    if (options.stage == 1) {
      grad_shards_.push_back(shard_of(reducer_.buffer(b)));
    } else {
      MemoryTagGuard tag(MemTag::kGrads);
      grad_shards_.push_back(Tensor::zeros({reducer_.padded_numel(b) / group.size()}, spec.dtype, group.device()));
    }
    // Cut the shard [first, first + P/N) at parameter boundaries; what lies past the last parameter is padding.
    const int64_t shard = reducer_.padded_numel(b) / group.size(), first = group.rank() * shard;
    for (size_t s = 0; s < spec.params.size(); ++s) {
      const int64_t begin = std::max(first, spec.offsets[s]);
      const int64_t end = std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel());
      if (begin >= end) continue;
      Tensor piece = flat_view(flat, begin, end - begin);
      piece.set_requires_grad(true);
      piece.set_grad(flat_view(grad_shards_[b], begin - first, end - begin));
      shard_params_.push_back(piece);
      shard_owner_.push_back(spec.params[s]);
      shard_pieces_.push_back({b, s, begin, end - begin});
    }
  }
  claim_updates(params, "dist::ZeroDataParallel (ZeRO-" + std::to_string(options.stage) + ")");
}

ZeroShards::~ZeroShards() {
  for (Tensor& p : claimed_) p.impl()->autograd.update_owner.clear();
}

void ZeroShards::claim_updates(const std::vector<Tensor>& params, const std::string& owner) {
  for (const Tensor& p : params) {
    p.impl()->autograd.update_owner = owner +
                                      ", which shards it: build the optimizer over zero.shard_groups(...) "
                                      "(this rank's shard of every parameter), not over the model's parameters";
    claimed_.push_back(p);
  }
}

void ZeroShards::begin_reduction() {
  MINIDL_CHECK(!awaiting_gather_,
               "ZeRO: this backward reduces gradients again, but the last step's update was "
               "never gathered: call gather_parameters() after every optimizer step (or skipped step), else each "
               "rank keeps only its own shard's update and the ranks' weights drift apart");
  awaiting_gather_ = true;
}

Tensor ZeroDataParallel::shard_of(const Tensor& flat) const {
  const int64_t shard = flat.numel() / world_;
  return flat_view(flat, rank_ * shard, shard);
}

std::vector<optim::ParamGroup> ZeroShards::shard_groups(const std::vector<optim::ParamGroup>& groups) const {
  const Reducer& r = reducer();
  std::unordered_map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of[p.impl()] = g;
  std::vector<optim::ParamGroup> out(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) out[g].weight_decay = groups[g].weight_decay;
  for (size_t i = 0; i < shard_params_.size(); ++i) {
    const size_t owner = shard_owner_[i];
    auto it = group_of.find(r.params()[owner].impl());
    MINIDL_CHECK(it != group_of.end(), "ZeRO: parameter ", r.names()[owner], " is in no optimizer parameter group");
    out[it->second].params.push_back(shard_params_[i]);
  }
  std::erase_if(out, [](const optim::ParamGroup& g) { return g.params.empty(); });
  return out;
}

void ZeroDataParallel::reduce_scatter_gradients() {
  MINIDL_ASSERT(!reducer_.sync(), "ZeRO: reduce_scatter_gradients() needs every backward under no_sync");
  begin_reduction();
  const std::vector<Tensor>& params = reducer_.params();
  for (size_t b = 0; b < reducer_.buckets().size(); ++b) {
    const BucketSpec& spec = reducer_.buckets()[b];
    Tensor bucket;
    if (options_.stage == 1) {
      bucket = reducer_.buffer(b);  // persistent; this rank's shard of it is grad_shards_[b]
    } else {
      MemoryTagGuard tag(MemTag::kGrads);
      bucket = Tensor::zeros({reducer_.padded_numel(b)}, spec.dtype, reducer_.group().device());
    }
    for (size_t s = 0; s < spec.params.size(); ++s) {
      Tensor p = params[spec.params[s]];  // a handle: set_grad below drops the parameter's own gradient
      Tensor slot = flat_view(bucket, spec.offsets[s], p.numel());
      if (p.grad().defined())
        slot.copy_(p.grad().contiguous().reshape({p.numel()}));
      else
        slot.zero_();
      p.set_grad(Tensor());
    }
    const trace::Span span(trace::enabled() ? "reduce-scatter bucket " + std::to_string(b) : "");
    reducer_.group().reduce_scatter(grad_shards_[b], bucket, ReduceOp::kAvg)->wait();
  }
}

void ZeroDataParallel::gather_parameters() {
  ProcessGroup& g = reducer_.group();
  const trace::Span span("all-gather parameters");
  for (Tensor& flat : flat_params_) g.all_gather(flat, shard_of(flat))->wait();
  if (options_.stage == 1)
    for (size_t b = 0; b < flat_params_.size(); ++b) reducer_.buffer(b).zero_();
  end_gather();
}

int64_t ZeroDataParallel::padded_numel() const {
  int64_t n = 0;
  for (const Tensor& flat : flat_params_) n += flat.numel();
  return n;
}

int64_t ZeroShards::shard_numel() const {
  int64_t n = 0;
  for (const Tensor& p : shard_params_) n += p.numel();
  return n;
}

}  // namespace minidl::dist
