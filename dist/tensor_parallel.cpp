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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// ---- ShardLayout ----

Shape ShardLayout::local_shape() const {
  if (!is_split()) return full_shape;
  Shape s = full_shape;
  s[size_t(dim)] = parts * ceil_div(full_shape[size_t(dim)] / parts, ranks);
  return s;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces() const {
  MINIDL_ASSERT(is_split(), "ShardLayout::pieces of a replicated layout");
  const int64_t part = full_shape[size_t(dim)] / parts, slice = ceil_div(part, ranks);
  MINIDL_ASSERT(part * parts == full_shape[size_t(dim)], "ShardLayout: ", full_shape[size_t(dim)],
                " does not split into ", parts, " parts");
  std::vector<Piece> out;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t start = int64_t(rank) * slice, length = std::max<int64_t>(0, std::min(slice, part - start));
    if (length > 0) out.push_back({p * part + start, p * slice, length});
  }
  return out;
}

Tensor ShardLayout::slice(const Tensor& full) const {
  MINIDL_CHECK(full.shape() == full_shape, "tensor parallel: expected a whole parameter of shape ", full_shape,
               ", got ", full.shape());
  if (!is_split()) return copy_of(full.to(Device::cpu()));
  Tensor local = Tensor::zeros(local_shape(), full.dtype());
  const Tensor src = full.to(Device::cpu());
  for (const Piece& p : pieces())
    local.narrow(dim, p.local_start, p.length).copy_(src.narrow(dim, p.full_start, p.length));
  return local;
}

void ShardLayout::scatter_into(Tensor& full, const Tensor& local) const {
  MINIDL_ASSERT(local.shape() == local_shape(), "ShardLayout: local shape ", local.shape(), ", expected ",
                local_shape());
  if (!is_split()) {
    full.copy_(local);
    return;
  }
  for (const Piece& p : pieces()) {
    Tensor dst = full.narrow(dim, p.full_start, p.length);
    dst.copy_(local.narrow(dim, p.local_start, p.length));
  }
}

void ShardLayout::init_normal(Tensor& local, double std, uint64_t seed, uint64_t stream) const {
  if (!is_split()) {
    nn::init_normal(local, std, seed, stream);
    return;
  }
  for (const Piece& p : pieces()) {
    Shape s = full_shape;
    s[size_t(dim)] = p.length;
    Tensor piece = Tensor::empty(s);
    nn::init_normal_slice(piece, std, seed, stream, full_shape, dim, p.full_start);
    local.narrow(dim, p.local_start, p.length).copy_(piece);
  }
}

// ---- layers ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group, bool bias,
                                           int64_t parts)
    : group_(group) {
  const int n = group.size();
  MINIDL_CHECK(in_features > 0 && out_features > 0 && out_features % (parts * n) == 0,
               "ColumnParallelLinear: expected out_features (", out_features, ") to split into ", parts, " part(s) x ",
               n, " tensor-parallel ranks, got in = ", in_features, ", out = ", out_features);
  weight_layout = {{in_features, out_features}, 1, parts, n, group.rank()};
  bias_layout = {{out_features}, 0, parts, n, group.rank()};
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::zeros(weight_layout.local_shape()));
  if (bias) this->bias = register_parameter("bias", Tensor::zeros(bias_layout.local_shape()));
}

Tensor ColumnParallelLinear::product(const Tensor& x) const {
  return sequence_parallel ? sequence_parallel_linear(x, weight, Tensor(), group_)
                           : matmul(copy_to_tensor_parallel(x, group_), weight);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  return sequence_parallel ? sequence_parallel_linear(x, weight, bias, group_)
                           : linear(copy_to_tensor_parallel(x, group_), weight, bias);
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group, bool bias)
    : group_(group) {
  const int n = group.size();
  MINIDL_CHECK(in_features > 0 && out_features > 0 && in_features % n == 0, "RowParallelLinear: expected in_features (",
               in_features, ") to split into ", n, " tensor-parallel ranks, got in = ", in_features,
               ", out = ", out_features);
  weight_layout = {{in_features, out_features}, 0, 1, n, group.rank()};
  bias_layout = ShardLayout::replicated({out_features});
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::zeros(weight_layout.local_shape()));
  if (bias) this->bias = register_parameter("bias", Tensor::zeros({out_features}));
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  Tensor partial = matmul(x, weight);
  Tensor y = sequence_parallel ? reduce_scatter_to_sequence_parallel(partial, group_)
                               : reduce_from_tensor_parallel(partial, group_);
  // In the output's dtype, as linear() adds it under autocast.
  return bias.defined() ? add(y, autograd::autocast_to(bias, y.dtype())) : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab, int64_t embedding_dim, ProcessGroup& group)
    : vocab_size(vocab), group_(group) {
  MINIDL_CHECK(vocab > 0 && embedding_dim > 0, "VocabParallelEmbedding: expected positive sizes, got ", vocab, " x ",
               embedding_dim);
  weight_layout = {{vocab, embedding_dim}, 0, 1, group.size(), group.rank()};
  vocab_per_rank = weight_layout.local_shape()[0];
  vocab_start = int64_t(group.rank()) * vocab_per_rank;
  {
    MemoryTagGuard tag(MemTag::kParams);
    weight = register_parameter("weight", Tensor::zeros(weight_layout.local_shape()));
  }
  if (vocab_start + vocab_per_rank > vocab) {
    std::vector<float> mask(size_t(vocab_per_rank), 0.0f);
    for (int64_t j = 0; j < vocab_per_rank; ++j)
      if (vocab_start + j >= vocab) mask[size_t(j)] = -std::numeric_limits<float>::infinity();
    MemoryTagGuard tag(MemTag::kOther);
    pad_mask_ = Tensor::from_vector(mask, {vocab_per_rank});
  }
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  if (group_.size() == 1) return embedding(weight, ids);
  MINIDL_CHECK(!sequence_parallel || (ids.dim() == 2 && ids.size(1) % group_.size() == 0),
               "sequence parallelism: the sequence length must be a multiple of --tp ", group_.size(),
               ", got ids of "
               "shape ",
               ids.shape());
  // Ids outside this rank's range look up row 0 and are zeroed, so the all-reduce adds exactly one real row per
  // id. The local rows and the mask are computed where the ids are (on a device: one kernel, no copy back).
  const ops::VocabRange local = ops::vocab_range(vocab_range_ids(ids), vocab_start, vocab_per_rank, 0, -1);
  Shape keep_shape = ids.shape();
  keep_shape.push_back(1);
  Tensor e;
  {
    ops::HostCheckedIndicesGuard in_range;  // [0, vocab_per_rank) by construction
    e = embedding(weight, local.index);
  }
  Tensor mask = local.in_range.reshape(keep_shape);
  e = mul(e, mask.dtype() == e.dtype() ? mask : ops::cast(mask, e.dtype()));
  return sequence_parallel ? reduce_scatter_to_sequence_parallel(e, group_) : reduce_from_tensor_parallel(e, group_);
}

Tensor VocabParallelEmbedding::logits(const Tensor& x) const {
  Tensor in = sequence_parallel ? gather_from_sequence_parallel(x, group_) : copy_to_tensor_parallel(x, group_);
  Tensor z = matmul(in, weight, false, true);
  if (!pad_mask_.defined()) return z;
  if (pad_mask_.device() != z.device()) pad_mask_ = pad_mask_.to(z.device());
  return add(z, pad_mask_);  // padded vocabulary rows: -inf
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

// ---- attention and MLP ----

ParallelSelfAttention::ParallelSelfAttention(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t dropout_stream,
                                             std::shared_ptr<const nn::DropoutContext> ctx)
    : group_(group), ctx_(ctx) {
  MINIDL_CHECK(cfg.n_head % group.size() == 0, "tensor parallelism: --tp ", group.size(), " must divide --heads ",
               cfg.n_head, " (attention is split by heads)");
  local_heads = cfg.n_head / group.size();
  c_attn =
      register_module("c_attn", std::make_shared<ColumnParallelLinear>(cfg.n_embd, 3 * cfg.n_embd, group, cfg.bias, 3));
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(cfg.n_embd, cfg.n_embd, group, cfg.bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<nn::Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor ParallelSelfAttention::forward(const Tensor& x) const {
  // c_attn's output is this rank's q, k and v heads, in that order: the layout causal_attention expects.
  Tensor y = c_proj->forward(causal_attention(c_attn->forward(x), int(local_heads)));
  return sequence_parallel_ ? sequence_parallel_dropout(*resid_dropout, *ctx_, y, group_) : resid_dropout->forward(y);
}

void ParallelSelfAttention::set_sequence_parallel(bool on) {
  sequence_parallel_ = c_attn->sequence_parallel = c_proj->sequence_parallel = on;
}

ParallelMLP::ParallelMLP(const nn::GPTConfig& cfg, ProcessGroup& group, uint64_t dropout_stream,
                         std::shared_ptr<const nn::DropoutContext> ctx)
    : group_(group), ctx_(ctx) {
  c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(cfg.n_embd, 4 * cfg.n_embd, group, cfg.bias));
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(4 * cfg.n_embd, cfg.n_embd, group, cfg.bias));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(cfg.dropout, dropout_stream, ctx));
}

Tensor ParallelMLP::forward(const Tensor& x) const {
  // As nn::MLP: the bias inside the fused GELU. GELU is elementwise, so it runs on each rank's columns alone.
  Tensor pre = c_fc->product(x);
  Tensor h = c_fc->bias.defined() ? bias_gelu(pre, c_fc->bias) : gelu(pre);
  Tensor y = c_proj->forward(h);
  return sequence_parallel_ ? sequence_parallel_dropout(*dropout, *ctx_, y, group_) : dropout->forward(y);
}

void ParallelMLP::set_sequence_parallel(bool on) {
  sequence_parallel_ = c_fc->sequence_parallel = c_proj->sequence_parallel = on;
}

}  // namespace minidl::dist
