#include "nn/layers.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <utility>

#include "ops/kernels/dropout.h"

#include "autograd/functions.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace minidl::nn {

void init_normal(Tensor& t, double std, uint64_t seed, uint64_t stream, uint64_t first_element) {
  MINIDL_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.device() == Device::cpu(),
               "init_normal: expected a contiguous f32 CPU tensor, got ", t.dtype(), " ", t.shape());
  float* p = t.data<float>();
  const Philox rng(seed, stream);
  const float s = float(std);
  parallel_for(0, t.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = s * rng.normal(first_element + uint64_t(i));
  });
}

void init_normal_slice(Tensor& t, double std, uint64_t seed, uint64_t stream, const Shape& full_shape, int64_t dim,
                       int64_t start) {
  MINIDL_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.device() == Device::cpu(),
               "init_normal_slice: expected a contiguous f32 CPU tensor, got ", t.dtype(), " ", t.shape());
  const int64_t n = int64_t(full_shape.size());
  MINIDL_CHECK(t.dim() == n && dim >= 0 && dim < n, "init_normal_slice: expected a tensor with the ", n,
               " dimensions of the full shape ", full_shape, " and 0 <= dim < ", n, ", got shape ", t.shape(),
               " and dim = ", dim);
  for (int64_t d = 0; d < n; ++d) {
    bool ok = d == dim ? start >= 0 && start + t.size(d) <= full_shape[int(d)] : t.size(d) == full_shape[int(d)];
    MINIDL_CHECK(ok, "init_normal_slice: shape ", t.shape(), " is not a slice of ", full_shape, " starting at ", start,
                 " along dimension ", dim);
  }
  // t is (outer, len, inner) inside the full (outer, full_len, inner): element (o, j, k) of t is element
  // ((o * full_len) + start + j) * inner + k of the whole parameter.
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full_shape[int(d)];
  for (int64_t d = dim + 1; d < n; ++d) inner *= full_shape[int(d)];
  const int64_t len = t.size(dim), full_len = full_shape[int(dim)];
  float* p = t.data<float>();
  const Philox rng(seed, stream);
  const float s = float(std);
  parallel_for(0, outer * len, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t o = row / len, j = row % len;
      const uint64_t first = uint64_t((o * full_len + start + j) * inner);
      for (int64_t k = 0; k < inner; ++k) p[row * inner + k] = s * rng.normal(first + uint64_t(k));
    }
  });
}

void init_uniform(Tensor& t, double low, double high, uint64_t seed, uint64_t stream, uint64_t first_element) {
  MINIDL_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.device() == Device::cpu(),
               "init_uniform: expected a contiguous f32 CPU tensor, got ", t.dtype(), " ", t.shape());
  float* p = t.data<float>();
  const Philox rng(seed, stream);
  const float lo = float(low), width = float(high - low);
  parallel_for(0, t.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = lo + width * rng.uniform(first_element + uint64_t(i));
  });
}

namespace {

// The default initialisation's seed and next stream. Streams start far above the ones models number their
// parameters with (GPT: 0, 1, ...; dropout: DropoutContext::kDropoutStreamBase + ...).
constexpr uint64_t kDefaultInitStreamBase = uint64_t(1) << 40;
std::atomic<uint64_t> g_default_seed{0};
std::atomic<uint64_t> g_next_stream{kDefaultInitStreamBase};
thread_local int t_skip_default_init = 0;

// (seed, stream) for the next layer's default draws; nullopt under SkipDefaultInit.
std::optional<std::pair<uint64_t, uint64_t>> next_default_init() {
  if (t_skip_default_init > 0) return std::nullopt;
  return std::make_pair(g_default_seed.load(), g_next_stream.fetch_add(1));
}

}  // namespace

void manual_seed(uint64_t seed) {
  g_default_seed = seed;
  g_next_stream = kDefaultInitStreamBase;
}

SkipDefaultInit::SkipDefaultInit() { ++t_skip_default_init; }
SkipDefaultInit::~SkipDefaultInit() { --t_skip_default_init; }

Linear::Linear(int64_t in_features, int64_t out_features, bool bias) {
  MINIDL_CHECK(in_features > 0 && out_features > 0, "Linear: expected positive sizes, got in=", in_features,
               " out=", out_features);
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::zeros({in_features, out_features}));
  if (bias) this->bias = register_parameter("bias", Tensor::zeros({out_features}));
  if (auto init = next_default_init()) {
    const double bound = 1.0 / std::sqrt(double(in_features));
    init_uniform(weight, -bound, bound, init->first, init->second);
    // The bias draws from the weight's stream, after the weight's numel() offsets.
    if (bias) init_uniform(this->bias, -bound, bound, init->first, init->second, uint64_t(weight.numel()));
  }
}

Tensor EmbeddingStyle::head_logits(const Embedding&, const Tensor&, int64_t) const {
  MINIDL_CHECK(false, "this embedding style does not split the vocabulary: it cannot be the tied head");
  return {};
}

Tensor EmbeddingStyle::head_loss(const Embedding&, const Tensor&, const Tensor&, Reduction) const {
  MINIDL_CHECK(false, "this embedding style does not split the vocabulary: it cannot be the tied head");
  return {};
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim) {
  MINIDL_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: expected positive sizes, got ", num_embeddings,
               " x ", embedding_dim);
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::zeros({num_embeddings, embedding_dim}));
  if (auto init = next_default_init()) init_normal(weight, 1.0, init->first, init->second);
}

LayerNorm::LayerNorm(int64_t dim, bool bias, double eps) : eps(eps) {
  MINIDL_CHECK(dim > 0, "LayerNorm: expected a positive size, got ", dim);
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::ones({dim}));
  if (bias)
    this->bias = register_parameter("bias", Tensor::zeros({dim}));
  else
    zero_bias_ = Tensor::zeros({dim});
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) {
  MINIDL_CHECK(dim > 0, "RMSNorm: expected a positive size, got ", dim);
  MINIDL_CHECK(eps > 0, "RMSNorm: expected eps > 0, got ", eps);
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::ones({dim}));
}

// The zeros take weight's dtype, which is the layernorm's parameter dtype also for 16-bit x (ops/layernorm.h).
Tensor LayerNorm::bias_for(const Tensor& x) const {
  if (bias.defined()) return bias;
  return zero_bias_.device() == x.device() && zero_bias_.dtype() == weight.dtype()
             ? zero_bias_
             : Tensor::zeros(zero_bias_.shape(), weight.dtype(), x.device());
}

Tensor LayerNorm::forward(const Tensor& x) const { return layernorm(x, weight, bias_for(x), eps); }

AddLayerNorm LayerNorm::forward_add(const Tensor& a, const Tensor& b) const {
  return add_layernorm(a, b, weight, bias_for(a), eps);
}

Dropout::Dropout(double p, uint64_t stream, std::shared_ptr<const DropoutContext> ctx)
    : p_(p), stream_(stream), ctx_(std::move(ctx)) {
  MINIDL_CHECK(p >= 0.0 && p < 1.0, "Dropout: expected 0 <= p < 1, got ", p);
  MINIDL_CHECK(ctx_ != nullptr, "Dropout: null DropoutContext");
}

Tensor Dropout::masked(const Tensor& x) const {
  if (!is_training() || p_ == 0.0) return x;
  if (ctx_->step_on_device.defined())
    return minidl::dropout(x, p_, ctx_->seed, stream_, ctx_->offset_in_step(x),
                           ops::DropoutStep{ctx_->step_on_device, DropoutContext::kOffsetsPerStep});
  return dropout(x, p_, ctx_->seed, stream_, ctx_->offset(x));
}

uint64_t DropoutContext::offset_in_step(const Tensor& x) const {
  int64_t first_element = x.dim() > 0 && x.size(0) > 0 ? first_sample * (x.numel() / x.size(0)) : 0;
  // The dropout op addresses draws of 8 elements; a slice must start on a draw boundary.
  constexpr int64_t kPer = ops::kernels::kDropoutPerDraw;
  MINIDL_CHECK(first_element % kPer == 0, "dropout: a batch slice starting at sample ", first_sample,
               " begins at element ", first_element, " of the global batch, which is not a multiple of ", kPer,
               "; use a model whose per-sample activation size (seq * embd) is a multiple of ", kPer);
  return uint64_t(first_element / kPer);
}

}  // namespace minidl::nn
