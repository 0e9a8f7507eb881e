// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout. Each is a thin Module over one differentiable op of
// autograd/functions.h, with parameters named as in Hugging Face GPT-2.
//
//   nn::manual_seed(1);                                 // the default initialisation's seed (else 0)
//   auto fc = std::make_shared<Linear>(768, 3072);      // weight (768, 3072), bias (3072): PyTorch's default init
//   Tensor y = fc->forward(x);                          // x: (..., 768) -> (..., 3072)
//
// Parameters are allocated under MemoryTagGuard(kParams), so the memory ledger shows them as "params".
#pragma once

#include <cstdint>
#include <memory>

#include "autograd/functions.h"
#include "nn/module.h"

namespace minidl::nn {

// Fills t (f32, contiguous) with N(0, std^2): element i is std * Philox(seed, stream).normal(first_element + i). A
// pure function of (seed, stream), so a model initialises identically on any machine and any number of ranks.
// first_element places t inside a larger parameter: a rank holding rows [r0, r1) of a (rows, cols) parameter passes
// first_element = r0 * cols and gets exactly those rows of the whole parameter.
void init_normal(Tensor& t, double std, uint64_t seed, uint64_t stream, uint64_t first_element = 0);

// Fills t with its part of a parameter of shape full_shape initialised by init_normal(full, std, seed, stream):
// t is full.narrow(dim, start, t.size(dim)) (any dimension: a column range of a weight is dim = 1), so a rank
// holding a tensor-parallel slice gets the values one process would give it.
//   init_normal_slice(w_cols, 0.02, seed, stream, /*full_shape=*/{C, 3 * C}, /*dim=*/1, /*start=*/rank * C);
void init_normal_slice(Tensor& t, double std, uint64_t seed, uint64_t stream, const Shape& full_shape, int64_t dim,
                       int64_t start);

// Fills t (f32, contiguous, CPU) with U(low, high): element i from Philox(seed, stream).uniform(first_element + i).
void init_uniform(Tensor& t, double low, double high, uint64_t seed, uint64_t stream, uint64_t first_element = 0);

// Default initialisation, PyTorch's rules: a Linear's weight and bias U(-1/sqrt(in), 1/sqrt(in)) (torch.nn.Linear's
// kaiming_uniform with a = sqrt(5)), an Embedding's weight N(0, 1), LayerNorm 1 and 0. Each layer draws from
// Philox(seed, stream) with the seed of manual_seed (0 until it is called) and the next stream of a per-seed
// counter, so a program that builds its layers in the same order gets the same weights on every run and every rank.
// manual_seed also restarts the counter.
void manual_seed(uint64_t seed);

// While one lives on this thread, Linear and Embedding start at zero and draw nothing: for a model that initialises
// every parameter itself (GPT: init_weights), so the default draws are not wasted. Nests.
class SkipDefaultInit {
 public:
  SkipDefaultInit();
  ~SkipDefaultInit();
  SkipDefaultInit(const SkipDefaultInit&) = delete;
  SkipDefaultInit& operator=(const SkipDefaultInit&) = delete;
};

class Linear;
class Embedding;
class Dropout;

// How a layer computes once a parallelism applied from outside the model has made its parameters this rank's
// slices (dist/tensor_parallel.h's styles, installed by dist::apply_tensor_parallel). A layer without one computes
// as written: one null check per call, and the model's code never changes.
struct LinearStyle {
  virtual ~LinearStyle() = default;
  virtual Tensor forward(const Linear& l, const Tensor& x) const = 0;  // x @ weight + bias
  virtual Tensor product(const Linear& l, const Tensor& x) const = 0;  // x @ weight (a caller adds the bias)
};
struct EmbeddingStyle {
  virtual ~EmbeddingStyle() = default;
  virtual Tensor forward(const Embedding& e, const Tensor& ids) const = 0;
  // As a tied output head (GPT's wte), for a style that splits the table: the whole logits x (..., C) ->
  // (..., vocab), and the cross-entropy of x's logits against targets (x's leading shape, -1 ignored). A style
  // that does not split the vocabulary throws, naming itself.
  virtual Tensor head_logits(const Embedding& e, const Tensor& x, int64_t vocab) const;
  virtual Tensor head_loss(const Embedding& e, const Tensor& x, const Tensor& targets, Reduction reduction) const;
};
struct DropoutStyle {
  virtual ~DropoutStyle() = default;
  virtual Tensor forward(const Dropout& d, const Tensor& x) const = 0;
};

// y = x @ weight + bias. weight: (in, out) — the GPT-2 "Conv1D" layout, the transpose of torch.nn.Linear's.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  // x: (..., in) -> (..., out)
  Tensor forward(const Tensor& x) const { return style ? style->forward(*this, x) : linear(x, weight, bias); }
  // x @ weight, without the bias (the MLP adds it inside its fused GELU).
  Tensor product(const Tensor& x) const { return style ? style->product(*this, x) : matmul(x, weight); }

  Tensor weight;                             // (in, out), U(-1/sqrt(in), 1/sqrt(in)) (zeros under SkipDefaultInit)
  Tensor bias;                               // (out), the same; undefined when constructed without bias
  std::shared_ptr<const LinearStyle> style;  // null: as written
};

// A lookup table: row ids[i] of weight.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  // ids: integer tensor of any shape, values in [0, num_embeddings) -> (*ids.shape, embedding_dim)
  Tensor forward(const Tensor& ids) const { return style ? style->forward(*this, ids) : embedding(weight, ids); }

  Tensor weight;  // (num_embeddings, embedding_dim), N(0, 1) (zeros under SkipDefaultInit)
  std::shared_ptr<const EmbeddingStyle> style;  // null: as written
};

// A normalisation over the last dimension with a learned scale (a block's or the head's norm, whichever kind the
// architecture uses): LayerNorm (GPT-2) or RMSNorm (Llama).
class Norm : public Module {
 public:
  // x: (..., dim) -> same shape
  virtual Tensor forward(const Tensor& x) const = 0;

  Tensor weight;  // (dim), starts at 1
};

// Layer normalisation over the last dimension (fused op). weight starts at 1, bias at 0.
class LayerNorm : public Norm {
 public:
  explicit LayerNorm(int64_t dim, bool bias = true, double eps = 1e-5);
  Tensor forward(const Tensor& x) const override;
  // {a + b, forward(a + b)} in one fused op (autograd add_layernorm): a residual add and the norm that reads it.
  AddLayerNorm forward_add(const Tensor& a, const Tensor& b) const;

  Tensor bias;  // (dim); undefined when constructed without bias
  double eps;

 private:
  Tensor zero_bias_;  // without bias: zeros for the fused op, which always adds one (not a parameter, not saved)
  Tensor bias_for(const Tensor& x) const;  // bias, or zeros like weight on x's device
};

// Root-mean-square normalisation (fused op, autograd rmsnorm): x * rsqrt(mean(x^2) + eps) in f32, rounded to x's
// dtype, then times weight (Llama's order: transformers #30236). eps comes from the model's config.
class RMSNorm : public Norm {
 public:
  RMSNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) const override { return rmsnorm(x, weight, eps); }

  double eps;
};

// Where dropout masks come from. A mask is a pure function of (seed, stream, step): the dropout op draws element i's
// keep/drop decision from Philox(seed, stream) at counter  step * kOffsetsPerStep + i / 8  (16 bits of the draw;
// see ops/kernels/dropout.h), where
// - seed:   chosen by the user (GPT uses its init seed);
// - stream: fixed per Dropout module at construction (GPT numbers its dropouts 0, 1, 2, ... in model order and
//           adds kDropoutStreamBase so they never share a stream with parameter initialisation);
// - step:   advanced by the training loop once per optimizer step;
// - first_sample: the position, in the step's global batch, of the first sample (dimension 0) this forward sees. A
//           rank (or micro-batch) that takes samples [b, b + n) of the global batch sets it to b, so sample j draws the
//           same mask whichever rank or micro-batch computes it: data parallelism and accumulation reproduce one
//           process exactly, dropout included. Element i of sample j is element j * (numel / n) + i of the batch.
// Nothing changes during a forward, so re-running a forward for the same step (activation checkpointing's
// recomputation) draws exactly the same masks, and a run restarted at step s reproduces its masks from s on.
// kOffsetsPerStep leaves 2^40 counters (2^43 elements) per step and stream: far more than any activation holds.
// step_on_device (CUDA graphs, train/cuda_graph.h): when defined, an i64 {1} on the model's device that its owner
// keeps equal to `step` (a fill kernel before each step); the dropout kernels then read the step there when they run
// instead of taking step * kOffsetsPerStep as an argument, so a replayed graph draws the current step's masks, the
// same as an eager step's. It must not change between a forward and its backward.
struct DropoutContext {
  static constexpr uint64_t kOffsetsPerStep = uint64_t(1) << 40;
  static constexpr uint64_t kDropoutStreamBase = uint64_t(1) << 32;

  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t first_sample = 0;
  Tensor step_on_device;
  // Philox counter of the first element of `x` (batch-first).
  uint64_t offset(const Tensor& x) const { return step * kOffsetsPerStep + offset_in_step(x); }
  // The part of offset(x) that does not depend on the step: first_sample's first element / kDropoutPerDraw.
  uint64_t offset_in_step(const Tensor& x) const;
};

// Inverted dropout: in training, zeroes each element with probability p and scales the rest by 1/(1-p); in eval
// mode (or with p == 0) returns x unchanged without touching the RNG.
class Dropout : public Module {
 public:
  // ctx is shared by all the dropouts of a model so one `ctx->step = s` moves them all.
  Dropout(double p, uint64_t stream, std::shared_ptr<const DropoutContext> ctx);
  Tensor forward(const Tensor& x) const { return style ? style->forward(*this, x) : masked(x); }
  // The dropout as written (what forward does without a style).
  Tensor masked(const Tensor& x) const;

  double p() const { return p_; }
  uint64_t stream() const { return stream_; }
  const DropoutContext& context() const { return *ctx_; }
  std::shared_ptr<const DropoutStyle> style;  // null: as written

 private:
  double p_;
  uint64_t stream_;
  std::shared_ptr<const DropoutContext> ctx_;
};

}  // namespace minidl::nn
