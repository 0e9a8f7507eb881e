#include "dist/tensor_parallel.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/memory.h"
#include "dist/sequence_parallel.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/vocab_range.h"

namespace minidl::dist {

namespace {

// A fresh contiguous copy of t on its device: collectives work in place and must not write into a tensor that
// autograd (or the caller) still holds.
Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  c.copy_(t);
  return c;
}

// ids as ops::vocab_range takes them: contiguous, and i64 on a device (the trainer's batches are uploaded as i64
// already; other device ids make one round trip through the host to convert).
Tensor vocab_range_ids(const Tensor& ids) {
  if (ids.device().is_cpu() || ids.dtype() == DType::i64) return ids.contiguous();
  return ops::cast(ids.to(Device::cpu()).contiguous(), DType::i64).to(ids.device());
}

std::atomic<int64_t> all_reduce_bytes{0}, all_gather_bytes{0}, reduce_scatter_bytes{0};

}  // namespace

TensorParallelTraffic tensor_parallel_traffic() {
  return {all_reduce_bytes.load(), all_gather_bytes.load(), reduce_scatter_bytes.load()};
}

void reset_tensor_parallel_traffic() { all_reduce_bytes = all_gather_bytes = reduce_scatter_bytes = 0; }

void counted_all_reduce(Tensor& tensor, ProcessGroup& group, ReduceOp op) {
  all_reduce_bytes += int64_t(tensor.nbytes());
  group.all_reduce(tensor, op)->wait();
}

void counted_all_gather(Tensor& output, const Tensor& input, ProcessGroup& group) {
  all_gather_bytes += int64_t(output.nbytes());
  group.all_gather(output, input)->wait();
}

void counted_reduce_scatter(Tensor& output, const Tensor& input, ProcessGroup& group) {
  reduce_scatter_bytes += int64_t(input.nbytes());
  group.reduce_scatter(output, input, ReduceOp::kSum)->wait();
}

void all_reduce_sum(const std::vector<Tensor>& tensors, ProcessGroup& group) {
  if (group.size() == 1 || tensors.empty()) return;
  int64_t total = 0;
  for (const Tensor& t : tensors) total += t.numel();
  Tensor flat = Tensor::empty({total}, tensors.front().dtype(), tensors.front().device());
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    Tensor dst = flat.narrow(0, at, t.numel());
    dst.copy_(t.reshape({t.numel()}));
    at += t.numel();
  }
  counted_all_reduce(flat, group, ReduceOp::kSum);
  at = 0;
  for (Tensor t : tensors) {
    t.copy_(flat.narrow(0, at, t.numel()).reshape(t.shape()));
    at += t.numel();
  }
}

Tensor copy_to_tensor_parallel(const Tensor& x, ProcessGroup& group) {
  if (group.size() == 1) return x;
  ProcessGroup* g = &group;
  return autograd::record("TensorParallelCopy", {x}, x.detach(), [g](const Tensor& gy) {
    Tensor sum = copy_of(gy);
    counted_all_reduce(sum, *g, ReduceOp::kSum);
    return std::vector<Tensor>{sum};
  });
}

Tensor reduce_from_tensor_parallel(const Tensor& x, ProcessGroup& group) {
  if (group.size() == 1) return x;
  Tensor y = copy_of(x);
  counted_all_reduce(y, group, ReduceOp::kSum);
  return autograd::record("TensorParallelReduce", {x}, y, [](const Tensor& gy) { return std::vector<Tensor>{gy}; });
}

Tensor gather_from_tensor_parallel(const Tensor& x, ProcessGroup& group) {
  const int n = group.size(), rank = group.rank();
  if (n == 1) return x;
  MINIDL_CHECK(x.dim() >= 1, "gather_from_tensor_parallel: expected at least one dimension, got ", x.shape());
  const int64_t last = x.size(x.dim() - 1), rows = x.numel() / last;
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    Tensor flat = Tensor::empty({int64_t(n) * x.numel()}, x.dtype(), x.device());
    counted_all_gather(flat, copy_of(x), group);
    // flat is (rank, rows, last); the result wants (rows, rank, last).
    out = flat.reshape({int64_t(n), rows, last}).transpose(0, 1).contiguous();
  }
  Shape shape = x.shape();
  shape[shape.size() - 1] = int64_t(n) * last;
  out = out.reshape(shape);
  const Shape x_shape = x.shape();
  return autograd::record("TensorParallelGather", {x}, out, [=](const Tensor& gy) {
    Tensor mine = gy.reshape({rows, int64_t(n), last}).narrow(1, rank, 1).contiguous().reshape(x_shape);
    return std::vector<Tensor>{mine};
  });
}

// ---- whole tensors from every rank's slices ----

nn::NamedTensors gather_whole(const std::vector<Tensor>& params, const nn::NamedTensors& local,
                              const std::function<bool(const std::string&)>& keep) {
  autograd::NoGradGuard no_grad;
  MINIDL_ASSERT(params.size() == local.size(), "gather_whole: ", local.size(), " tensors for ", params.size(),
                " parameters");
  nn::NamedTensors whole;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = local[i];
    const nn::ParamLayout mine = nn::layout_of(params[i]);
    MINIDL_ASSERT(p.shape() == mine.local_shape(), "gather_whole: ", name, " has shape ", p.shape(), ", expected ",
                  mine.local_shape());
    const bool kept = !keep || keep(name);
    if (!mine.is_split()) {
      if (kept) whole.emplace_back(name, p.to(Device::cpu()).clone());
      continue;
    }
    ProcessGroup& group = *mine.group;
    const int n = group.size();
    Tensor all = Tensor::empty({int64_t(n) * p.numel()}, p.dtype(), p.device());
    group.all_gather(all, p.contiguous())->wait();
    if (!kept) continue;
    all = all.to(Device::cpu());
    Tensor full = Tensor::zeros(mine.full_shape, p.dtype());
    for (int r = 0; r < n; ++r) {
      nn::ParamLayout theirs = mine;
      theirs.rank = r;  // every rank's layout is the same function of its rank
      theirs.scatter_into(full, all.narrow(0, int64_t(r) * p.numel(), p.numel()).reshape(p.shape()));
    }
    whole.emplace_back(name, full);
  }
  return whole;
}

// ---- styles ----

Tensor ColumnParallel::product(const nn::Linear& l, const Tensor& x) const {
  return sequence_input_ ? sequence_parallel_linear(x, l.weight, Tensor(), group_)
                         : matmul(copy_to_tensor_parallel(x, group_), l.weight);
}

Tensor ColumnParallel::forward(const nn::Linear& l, const Tensor& x) const {
  return sequence_input_ ? sequence_parallel_linear(x, l.weight, l.bias, group_)
                         : linear(copy_to_tensor_parallel(x, group_), l.weight, l.bias);
}

Tensor RowParallel::reduce(const Tensor& partial) const {
  return sequence_output_ ? reduce_scatter_to_sequence_parallel(partial, group_)
                          : reduce_from_tensor_parallel(partial, group_);
}

Tensor RowParallel::product(const nn::Linear& l, const Tensor& x) const { return reduce(matmul(x, l.weight)); }

Tensor RowParallel::forward(const nn::Linear& l, const Tensor& x) const {
  Tensor partial = matmul(x, l.weight);
  Tensor y = reduce(partial);
  // In the output's dtype, as linear() adds it under autocast.
  return l.bias.defined() ? add(y, autograd::autocast_to(l.bias, y.dtype())) : y;
}

VocabParallel::VocabParallel(ProcessGroup& group, int64_t vocab, bool sequence_output)
    : vocab_size(vocab), group_(group), sequence_output_(sequence_output) {
  vocab_per_rank = (vocab + group.size() - 1) / group.size();
  vocab_start = int64_t(group.rank()) * vocab_per_rank;
  if (vocab_start + vocab_per_rank > vocab) {
    std::vector<float> mask(size_t(vocab_per_rank), 0.0f);
    for (int64_t j = 0; j < vocab_per_rank; ++j)
      if (vocab_start + j >= vocab) mask[size_t(j)] = -std::numeric_limits<float>::infinity();
    MemoryTagGuard tag(MemTag::kOther);
    pad_mask_ = Tensor::from_vector(mask, {vocab_per_rank});
  }
}

Tensor VocabParallel::forward(const nn::Embedding& e, const Tensor& ids) const {
  MINIDL_CHECK(!sequence_output_ || (ids.dim() == 2 && ids.size(1) % group_.size() == 0),
               "--sequence-parallel: the sequence length must be a multiple of --tp ", group_.size(),
               ", got ids of shape ", ids.shape());
  // Ids outside this rank's range look up row 0 and are zeroed, so the all-reduce adds exactly one real row per
  // id. The local rows and the mask are computed where the ids are (on a device: one kernel, no copy back).
  const ops::VocabRange local = ops::vocab_range(vocab_range_ids(ids), vocab_start, vocab_per_rank, 0, -1);
  Shape keep_shape = ids.shape();
  keep_shape.push_back(1);
  Tensor rows;
  {
    ops::HostCheckedIndicesGuard in_range;  // [0, vocab_per_rank) by construction
    rows = embedding(e.weight, local.index);
  }
  Tensor mask = local.in_range.reshape(keep_shape);
  rows = mul(rows, mask.dtype() == rows.dtype() ? mask : ops::cast(mask, rows.dtype()));
  return sequence_output_ ? reduce_scatter_to_sequence_parallel(rows, group_)
                          : reduce_from_tensor_parallel(rows, group_);
}

Tensor VocabParallel::local_logits(const nn::Embedding& e, const Tensor& x) const {
  Tensor in = sequence_output_ ? gather_from_sequence_parallel(x, group_) : copy_to_tensor_parallel(x, group_);
  Tensor z = matmul(in, e.weight, false, true);
  if (!pad_mask_.defined()) return z;
  if (pad_mask_.device() != z.device()) pad_mask_ = pad_mask_.to(z.device());
  return add(z, pad_mask_);  // padded vocabulary rows: -inf
}

Tensor VocabParallel::head_logits(const nn::Embedding& e, const Tensor& x, int64_t vocab) const {
  // Padding rows sit at the end of the padded vocabulary: the first vocab columns are the real ones.
  return gather_from_tensor_parallel(local_logits(e, x), group_).narrow(2, 0, vocab);
}

Tensor VocabParallel::head_loss(const nn::Embedding& e, const Tensor& x, const Tensor& targets,
                                Reduction reduction) const {
  Tensor z = local_logits(e, x);  // (B, T, V / tp)
  const int64_t N = targets.numel();
  return vocab_parallel_cross_entropy(z.reshape({N, z.size(2)}), targets.reshape({N}), vocab_start, group_, -1,
                                      reduction);
}

Tensor SequenceParallelDropout::forward(const nn::Dropout& d, const Tensor& x) const {
  return sequence_parallel_dropout(d, d.context(), x, group_);
}

Tensor SequenceShardedPositions::forward(const nn::Embedding& e, const Tensor& ids) const {
  const int64_t T = ids.size(0), n = group_.size();
  MINIDL_CHECK(T % n == 0, "--sequence-parallel: the sequence length T = ", T, " must be a multiple of --tp ", n);
  return embedding(e.weight, ids.narrow(0, int64_t(group_.rank()) * (T / n), T / n));
}

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets, int64_t vocab_start,
                                    ProcessGroup& group, int64_t ignore_index, Reduction reduction) {
  MINIDL_CHECK(local_logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == local_logits.size(0),
               "vocab_parallel_cross_entropy: expected logits (N, V / tp) and targets (N), got ", local_logits.shape(),
               " and ", targets.shape());
  autograd::AutocastGuard full_precision(DType::f32);
  // 16-bit logits to f32: on a device by the cast kernel (Tensor::to converts through a host copy).
  const Tensor z = local_logits.dtype() == DType::f32 ? local_logits
                   : local_logits.device().is_cpu()   ? local_logits.to(DType::f32)
                                                      : autograd::autocast_to(local_logits, DType::f32);
  const int64_t N = z.size(0), V = z.size(1);
  const Device device = z.device();

  // Where each row's target logit is, if this rank holds it: flat index n * V + (t - vocab_start); computed where
  // the targets are (on a device: one kernel, no copy back).
  const ops::VocabRange where = ops::vocab_range(vocab_range_ids(targets), vocab_start, V, V, ignore_index);

  // m: the row maxima over the whole vocabulary. A constant: log-sum-exp does not depend on the shift.
  Tensor m;
  {
    autograd::NoGradGuard no_grad;
    m = copy_of(max(z.detach(), 1, /*keepdim=*/true));  // (N, 1)
    if (group.size() > 1) counted_all_reduce(m, group, ReduceOp::kMax);
  }
  // S = sum over the vocabulary of exp(z - m); padded columns are exp(-inf) = 0.
  Tensor S = reduce_from_tensor_parallel(sum(exp(sub(z, m)), 1), group);  // (N)
  // z_t, read by a gather (an embedding lookup into z viewed as an (N * V, 1) table): its backward puts the
  // gradient at the target column alone. Zero on the ranks that do not hold the target.
  Tensor zt;
  {
    ops::HostCheckedIndicesGuard in_range;
    zt = embedding(z.reshape({N * V, 1}), where.index).reshape({N});
  }
  zt = reduce_from_tensor_parallel(mul(zt, where.in_range), group);
  Tensor per_row = sub(add(log(S), m.reshape({N})), zt);
  Tensor loss = sum(mul(per_row, where.counted));
  if (reduction != Reduction::kMean) return loss;
  if (device.is_cpu()) {
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) count += where.counted.data<float>()[n] != 0.0f;
    return mul(loss, 1.0 / double(count));
  }
  return div(loss, sum(where.counted));  // the count stays on the device (exact in f32 below 2^24 rows)
}

}  // namespace minidl::dist
