#include "train/grad_sync.h"

#include "dist/expert_parallel.h"

#include <chrono>

#include "dist/flight_recorder.h"
#include "dist/tensor_parallel.h"
#include "nn/param_layout.h"
#include "ops/elementwise.h"
#include "optim/clip.h"

namespace minidl::train {

namespace {

double reduce_one(dist::ProcessGroup& group, double value, dist::ReduceOp op) {
  if (group.size() == 1) return value;
  Tensor t = Tensor::full({1}, value, DType::f64, group.device());
  group.all_reduce(t, op)->wait();
  return t.item();
}

}  // namespace

double sum_over(dist::ProcessGroup& group, double value) { return reduce_one(group, value, dist::ReduceOp::kSum); }
double max_over(dist::ProcessGroup& group, double value) { return reduce_one(group, value, dist::ReduceOp::kMax); }

const Tensor& sum_over(dist::ProcessGroup& group, const Tensor& t) {
  Tensor shared = t;  // a handle on the same data
  if (group.size() > 1) group.all_reduce(shared, dist::ReduceOp::kSum)->wait();
  return t;
}

const Tensor& max_over(dist::ProcessGroup& group, const Tensor& t) {
  Tensor shared = t;
  if (group.size() > 1) group.all_reduce(shared, dist::ReduceOp::kMax)->wait();
  return t;
}

// One chunk's data-parallel engine: DDP, ZeRO 1-2 or ZeRO-3 (at most one of them), and its no_sync guard.
struct GradSync::Engine {
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  // Expert parallelism: the routed experts' own DDP, over the expert-dp group (dist/expert_parallel.h).
  std::unique_ptr<dist::DistributedDataParallel> expert_ddp;
  std::optional<dist::Reducer::NoSyncGuard> expert_no_sync;
  std::unique_ptr<dist::ZeroDataParallel> zero;
  std::unique_ptr<dist::ZeroStage3> zero3;
  std::vector<std::string> names;  // the chunk's parameters, in order
  // false: every backward runs under no_sync and the buckets are reduced after the step's last one (a ZeRO chunk
  // holding the tied wte, whose gradient needs the other stage's half first).
  bool overlaps = true;
  std::optional<dist::Reducer::NoSyncGuard> no_sync;

  dist::ZeroShards* shards() const {
    if (zero) return zero.get();
    return zero3.get();
  }
  dist::Reducer* reducer() const {
    if (ddp) return &ddp->reducer();
    return shards() ? &shards()->reducer() : nullptr;
  }
};

GradSync::GradSync(const Stage& stage, const dist::Topology& topology, SyncOptions o)
    : zero_(o.zero), tp_size_(topology.grid().tp) {
  MINIDL_CHECK(o.zero >= 0 && o.zero <= 3, "ZeRO: expected stage 0, 1, 2 or 3, got ", o.zero);
  MINIDL_CHECK(o.zero < 3 || stage.spec().stages == 1, "--zero 3 with --pp ", stage.spec().stages,
               ": ZeRO-3 "
               "gathers each block's parameters just before use, which a pipeline stage's interleaved micro-batches "
               "would gather and free again and again (DeepSpeed refuses it too); use --zero 1 or 2 with --pp");
  dist::ProcessGroup& dp = topology.dp_group();
  name_ = zero_ > 0 ? "zero" + std::to_string(zero_) : dp.size() > 1 ? "ddp" : "none";
  if (topology.grid().pp > 1) name_ += "+pipeline";
  if (topology.grid().tp > 1) name_ += "+tp";
  if (zero_ > 0) norm_groups_.push_back(&dp);  // each dp rank holds its shard
  norm_groups_.push_back(&topology.model_parallel_group());
  overflow_groups_ = {&dp, &topology.model_parallel_group()};
  Tensor tied = tied_ = stage.tied_weight();
  if (tied.defined()) tied_group_ = topology.embedding_group();
  for (int v = 0; v < stage.chunk_count(); ++v)
    for (const Tensor& p : stage.chunk(v).parameters())
      if (stage.is_tied_copy(p)) tied_copy_ = p;
  dp_ = &dp;
  tp_group_ = &topology.tp_group();
  const int ep = topology.grid().ep;
  if (ep > 1) {
    MINIDL_CHECK(o.zero == 0, "--ep with --zero ", o.zero, ": ZeRO does not shard the experts' own group yet");
    ep_group_ = &topology.ep_group();
    name_ += "+ep";
  }
  params_ = stage.parameters();
  for (const Tensor& p : params_) sliced_ |= nn::layout_of(p).sequence_sliced;  // the same on every tp rank
  pipelined_ = topology.grid().pp > 1;
  for (int v = 0; v < stage.chunk_count(); ++v) {
    auto e = std::make_unique<Engine>();
    std::vector<std::pair<std::string, Tensor>> params;
    bool holds_tied = false;
    std::vector<std::pair<std::string, Tensor>> experts;  // under expert parallelism: the routed experts'
    for (auto& [name, p] : stage.chunk(v).named_parameters()) {
      e->names.push_back(name);
      holds_tied = holds_tied || (tied.defined() && p.impl() == tied.impl());
      if (ep > 1 && dist::is_expert_parameter(name)) {
        experts.emplace_back(name, p);
        expert_params_.push_back(p);
        expert_impls_.insert(p.impl());
        continue;
      }
      // DDP leaves the tied wte to the embedding group's sum and its own average, after the last backward.
      if (o.zero > 0 || !tied.defined() || p.impl() != tied.impl()) params.emplace_back(name, p);
    }
    if (!experts.empty() && topology.expert_dp_group().size() > 1)
      e->expert_ddp =
          std::make_unique<dist::DistributedDataParallel>(experts, topology.expert_dp_group(),
                                                          dist::DDPOptions{.caps = o.caps,
                                                                           .broadcast_at_start = o.broadcast_at_start,
                                                                           .buckets = {},
                                                                           .compression = dist::Compression::kNone,
                                                                           .powersgd = nullptr});
    if (o.zero == 3) {
      e->zero3 = std::make_unique<dist::ZeroStage3>(stage.chunk(v), dp, dist::Zero3Options{o.broadcast_at_start});
    } else if (o.zero > 0) {
      e->zero = std::make_unique<dist::ZeroDataParallel>(
          params, dp, dist::ZeroOptions{.stage = o.zero, .caps = o.caps, .broadcast_at_start = o.broadcast_at_start});
      e->overlaps = !holds_tied;
    } else if (dp.size() > 1) {
      e->ddp = std::make_unique<dist::DistributedDataParallel>(
          params, dp,
          dist::DDPOptions{.caps = o.caps,
                           .broadcast_at_start = o.broadcast_at_start,
                           .buckets = o.buckets,
                           .compression = o.compression,
                           .powersgd = o.powersgd ? std::make_shared<dist::PowerSgd>(*o.powersgd) : nullptr});
      if (holds_tied && o.broadcast_at_start) dp.broadcast(tied, 0)->wait();
    }
    if (!e->overlaps) e->no_sync.emplace(*e->reducer());  // for good: after_backward reduce-scatters
    if (const dist::ZeroShards* z = e->shards())
      for (size_t i = 0; i < z->shard_params().size(); ++i)
        origin_[z->shard_params()[i].impl()] = z->reducer().params()[z->shard_owners()[i]];
    engines_.push_back(std::move(e));
  }
}

GradSync::GradSync() = default;

GradSync& GradSync::one_process() {
  static GradSync none;
  return none;
}
GradSync::~GradSync() = default;

std::string GradSync::name() const { return name_; }

void GradSync::before_backward(int chunk, bool last) {
  if (engines_.empty()) return;
  Engine& e = *engines_[size_t(chunk)];
  if (e.expert_ddp) {
    e.expert_no_sync.reset();
    if (!last) e.expert_no_sync.emplace(e.expert_ddp->reducer());
  }
  if (!e.overlaps || !e.reducer()) return;
  e.no_sync.reset();
  if (!last) e.no_sync.emplace(*e.reducer());
}

void GradSync::after_backward() {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& e : engines_) {
    if (e->overlaps) e->no_sync.reset();
    e->expert_no_sync.reset();
  }
  // An expert's gradient, averaged over the ranks holding it, is ep times one process's (dist/expert_parallel.h).
  if (ep_group_)
    for (const Tensor& p : expert_params_)
      if (p.grad().defined()) {
        Tensor g = p.grad();
        g.copy_(ops::mul(g, 1.0 / double(ep_group_->size())));
      }
  if (tied_group_) {
    // The first stage's wte gradient comes from the embedding, the last stage's from the head: both need the sum,
    // then (outside ZeRO, which reduce-scatters it below) the average over dp, as every other gradient had.
    const dist::CallSite site("tied wte");
    Tensor g = tied_.grad();
    tied_group_->all_reduce(g, dist::ReduceOp::kSum)->wait();
    if (zero_ == 0 && dp_->size() > 1) dp_->all_reduce(g, dist::ReduceOp::kAvg)->wait();
  }
  for (auto& e : engines_)
    if (!e->overlaps) e->zero->reduce_scatter_gradients();
  if (pipelined_)
    pipeline_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Parameters that act on this rank's positions only (sequence parallelism: nn::ParamLayout's sequence_sliced)
  // hold partial gradients: one all-reduce over a flat copy of them all (LayerNorm-sized vectors and wpe), or of
  // their ZeRO shards. The sum over tp of the average over dp is the average of the sums.
  if (!sliced_) return;
  std::vector<Tensor> grads;
  for (const Tensor& p : owned_params(params_))
    if (nn::layout_of(origin(p)).sequence_sliced && p.grad().defined()) grads.push_back(p.grad());
  dist::all_reduce_sum(grads, *tp_group_);
}

dist::ZeroDataParallel& GradSync::zero(int v) const {
  MINIDL_ASSERT(size_t(v) < engines_.size() && engines_[size_t(v)]->zero, "GradSync: chunk ", v, " has no ZeRO 1-2");
  return *engines_[size_t(v)]->zero;
}

dist::ZeroStage3& GradSync::zero3(int v) const {
  MINIDL_ASSERT(size_t(v) < engines_.size() && engines_[size_t(v)]->zero3, "GradSync: chunk ", v, " has no ZeRO-3");
  return *engines_[size_t(v)]->zero3;
}

std::vector<Tensor> GradSync::owned_params(const std::vector<Tensor>& params) const {
  if (zero_ == 0 || engines_.empty()) return params;
  std::vector<Tensor> out;
  for (const auto& e : engines_)
    for (const Tensor& p : e->shards()->shard_params()) out.push_back(p);
  return out;
}

Tensor GradSync::origin(const Tensor& owned) const {
  if (zero_ == 0) return owned;
  auto it = origin_.find(owned.impl());
  MINIDL_ASSERT(it != origin_.end(), "ZeRO: a tensor that is not one of this rank's shard parameters");
  return it->second;
}

std::vector<optim::ParamGroup> GradSync::optimizer_groups(std::vector<optim::ParamGroup> groups) const {
  if (zero_ == 0 || engines_.empty()) return groups;
  std::vector<optim::ParamGroup> out;
  for (const auto& e : engines_)
    for (optim::ParamGroup& g : e->shards()->shard_groups(groups)) out.push_back(std::move(g));
  return out;
}

void GradSync::after_step() {
  for (auto& e : engines_) {
    if (e->zero) e->zero->gather_parameters();
    if (e->zero3) e->zero3->gather_parameters();
  }
}

void GradSync::hold_full_parameters(bool hold) {
  for (auto& e : engines_)
    if (e->zero3) e->zero3->hold_full(hold);
}

dist::ReducerStats GradSync::comm_stats() const {
  dist::ReducerStats s;
  for (const auto& e : engines_)
    if (const dist::Reducer* r = e->reducer()) {
      s.comm_ms += r->last_step().comm_ms;
      s.exposed_comm_ms += r->last_step().exposed_comm_ms;
    }
  if (pipelined_) {  // the tied wte and what waited for it: all exposed
    s.comm_ms += pipeline_ms_;
    s.exposed_comm_ms += pipeline_ms_;
  }
  return s;
}

namespace {

// The squares of gradients on the host, or on a device without a host round trip; a split part plus 1/tp of a
// replicated one (host: a division, device: a multiplication by the reciprocal).
double squares(const std::vector<Tensor>& params, double*, Device) { return optim::grad_norm_squared(params); }
Tensor squares(const std::vector<Tensor>& params, Tensor*, Device device) {
  return optim::grad_norm_squared_tensor(params, device);
}
double plus_share(double split, double replicated, int tp) { return split + replicated / tp; }
Tensor plus_share(const Tensor& split, const Tensor& replicated, int tp) {
  return ops::add(split, ops::mul(replicated, 1.0 / tp));
}

}  // namespace

template <class T>
T GradSync::norm_squared(const std::vector<Tensor>& params, Device device) const {
  // The squares with the tied copy left out, summed over the groups that hold the other parts.
  auto part = [&](const std::vector<Tensor>& some) {
    std::vector<Tensor> counted;
    for (const Tensor& p : some)
      if (!tied_copy_.defined() || origin(p).impl() != tied_copy_.impl()) counted.push_back(p);
    T mine = squares(counted, static_cast<T*>(nullptr), device);
    for (dist::ProcessGroup* g : norm_groups_) mine = T(sum_over(*g, mine));
    return mine;
  };
  if (ep_group_) {  // a rank holds its experts alone: their squares are the ep group's together
    std::vector<Tensor> dense, experts;
    for (const Tensor& p : params) { (expert_impls_.count(p.impl()) ? experts : dense).push_back(p); }
    const T dense_sq = part(dense);
    return plus_share(T(sum_over(*ep_group_, part(experts))), dense_sq, 1);
  }
  if (tp_size_ == 1) return part(params);
  // A replicated parameter (its layout says so) is held tp times but counts once: the split ones' squares plus
  // 1/tp of the replicated ones', two collectives of one number each, in the same order on every rank.
  std::vector<Tensor> split, replicated;
  for (const Tensor& p : params) (nn::layout_of(origin(p)).is_replicated() ? replicated : split).push_back(p);
  const T split_sq = part(split);
  return plus_share(split_sq, part(replicated), tp_size_);
}

double GradSync::grad_norm_squared(const std::vector<Tensor>& params) const {
  return norm_squared<double>(params, Device::cpu());
}

Tensor GradSync::grad_norm_squared_on_device(const std::vector<Tensor>& params, Device device) const {
  return norm_squared<Tensor>(params, device);
}

bool GradSync::combine_overflow(bool local) const {
  double any = local ? 1.0 : 0.0;
  for (dist::ProcessGroup* g : overflow_groups_) any = max_over(*g, any);
  return any > 0;
}

void GradSync::combine_overflow_on_device(const Tensor& found_inf) const {
  for (dist::ProcessGroup* g : overflow_groups_) max_over(*g, found_inf);
}

nn::NamedTensors GradSync::state(const optim::Optimizer& opt, const Tensor& flat, const Stage& stage, int v,
                                 const KeepTensors& keep) {
  const Engine* e = engines_.empty() ? nullptr : engines_[size_t(v)].get();
  dist::ZeroShards* z = e ? e->shards() : nullptr;
  nn::NamedTensors out;
  if (!z) {
    for (const auto& [name, p] : stage.chunk(v).named_parameters())
      if (keep(name)) out.emplace_back(name, opt.state_of(flat, p));
    return out;
  }
  dist::Reducer& reducer = z->reducer();
  std::vector<Tensor> values;
  for (const Tensor& p : z->shard_params()) values.push_back(opt.state_of(flat, p));
  std::vector<bool> kept(reducer.params().size());
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = keep(reducer.names()[i]);
  std::vector<Tensor> whole = dist::gather_logical(reducer, z->shard_pieces(), values, kept);
  std::map<std::string, Tensor> by_name;
  for (size_t i = 0; i < whole.size(); ++i)
    if (kept[i]) by_name[reducer.names()[i]] = whole[i];
  for (const std::string& name : e->names)
    if (keep(name)) out.emplace_back(name, by_name.at(name));
  return out;
}

void GradSync::load_state(const optim::Optimizer& opt, Tensor& flat, const Stage& stage, int v,
                          const std::map<std::string, Tensor>& logical) const {
  const Engine* e = engines_.empty() ? nullptr : engines_[size_t(v)].get();
  const dist::ZeroShards* z = e ? e->shards() : nullptr;
  if (!z) {
    for (const auto& [name, p] : stage.chunk(v).named_parameters()) opt.state_of(flat, p).copy_(logical.at(name));
    return;
  }
  std::vector<Tensor> whole;
  for (const std::string& name : z->reducer().names()) whole.push_back(logical.at(name));
  std::vector<Tensor> mine = dist::slice_logical(z->reducer(), z->shard_pieces(), whole);
  for (size_t i = 0; i < z->shard_params().size(); ++i) opt.state_of(flat, z->shard_params()[i]).copy_(mine[i]);
}

}  // namespace minidl::train
