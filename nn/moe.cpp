#include "nn/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/cast.h"

namespace minidl::nn {

int64_t expert_capacity(double factor, int64_t tokens, int64_t k, int64_t experts) {
  if (factor <= 0) return -1;
  return int64_t(std::ceil(factor * double(tokens * k) / double(experts)));
}

Routing route(const std::vector<double>& choice, int64_t tokens, int64_t experts, int64_t k, int64_t capacity,
              int64_t sequence) {
  MINIDL_CHECK(int64_t(choice.size()) == tokens * experts, "route: expected ", tokens, " x ", experts, " scores, got ",
               choice.size());
  MINIDL_CHECK(k >= 1 && k <= experts, "route: expected 1 <= k <= experts (", experts, "), got ", k);
  Routing r;
  r.tokens = tokens, r.k = k, r.experts = experts;
  r.expert.resize(size_t(tokens * k));
  r.routed.assign(size_t(experts), 0);
  std::vector<int32_t> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const double* s = choice.data() + t * experts;
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      r.expert[size_t(t * k + j)] = ids[size_t(j)];
      r.routed[size_t(ids[size_t(j)])] += 1;
    }
  }
  // Capacity, per sequence in slot order; then each expert's kept slots, expert-major.
  if (sequence <= 0) sequence = tokens;
  MINIDL_CHECK(tokens % sequence == 0, "route: ", tokens, " tokens are not whole sequences of ", sequence);
  r.kept.assign(size_t(experts), 0);
  r.row.assign(size_t(tokens * k), -1);
  std::vector<int64_t> rank_in_expert(size_t(tokens * k), -1), in_sequence(size_t(experts), 0);
  for (int64_t s = 0; s < tokens * k; ++s) {
    if (s % (sequence * k) == 0) std::fill(in_sequence.begin(), in_sequence.end(), 0);
    const size_t e = size_t(r.expert[size_t(s)]);
    if (capacity >= 0 && in_sequence[e] >= capacity) continue;
    ++in_sequence[e];
    rank_in_expert[size_t(s)] = r.kept[e]++;
  }
  std::vector<int64_t> offset(size_t(experts), 0);
  for (int64_t e = 1; e < experts; ++e) offset[size_t(e)] = offset[size_t(e - 1)] + r.kept[size_t(e - 1)];
  r.order.assign(size_t(std::accumulate(r.kept.begin(), r.kept.end(), int64_t(0))), 0);
  for (int64_t s = 0; s < tokens * k; ++s) {
    if (rank_in_expert[size_t(s)] < 0) continue;
    r.row[size_t(s)] = offset[size_t(r.expert[size_t(s)])] + rank_in_expert[size_t(s)];
    r.order[size_t(r.row[size_t(s)])] = s;
  }
  return r;
}

std::vector<int64_t> expert_major_order(const std::vector<int64_t>& counts, int64_t groups, int64_t experts) {
  MINIDL_CHECK(groups >= 1 && experts >= 1 && int64_t(counts.size()) == groups * experts,
               "expert_major_order: expected ", groups, " x ", experts, " counts, got ", counts.size());
  std::vector<int64_t> start(counts.size(), 0);  // where group g's rows for expert e begin, group-major
  for (size_t i = 1; i < counts.size(); ++i) start[i] = start[i - 1] + counts[i - 1];
  std::vector<int64_t> out;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t i = size_t(g * experts + e);
      MINIDL_CHECK(counts[i] >= 0, "expert_major_order: expected counts >= 0, got ", counts[i]);
      for (int64_t j = 0; j < counts[i]; ++j) out.push_back(start[i] + j);
    }
  return out;
}

std::vector<int64_t> rows_per_expert(const std::vector<int64_t>& counts, int64_t groups, int64_t experts) {
  MINIDL_CHECK(int64_t(counts.size()) == groups * experts, "rows_per_expert: expected ", groups, " x ", experts,
               " counts, got ", counts.size());
  std::vector<int64_t> out(size_t(experts), 0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t e = 0; e < experts; ++e) out[size_t(e)] += counts[size_t(g * experts + e)];
  return out;
}

namespace {

GPTConfig expert_config(const GPTConfig& cfg, int64_t width) {
  GPTConfig c = cfg;
  c.dropout = 0;  // the layer's own dropout acts once on the sum
  c.intermediate_size = width;
  return c;
}

// rows of a (R, C) table at `ids` (i64, on the table's device) -> (len(ids), C), differentiably (the gradient
// scatters back, added in increasing row order: bitwise reproducible). A 16-bit table is gathered through an f32
// copy, as the embedding kernel takes it, and the rows come back in its dtype.
Tensor gather_rows(const Tensor& table, const Tensor& ids) {
  const DType dt = table.dtype();
  if (!ops::is_half(dt)) return embedding(table, ids);
  return autograd::autocast_to(embedding(autograd::autocast_to(table, DType::f32), ids), dt);
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return Tensor::from_vector(v, {int64_t(v.size())}).to(device);
}

// y itself in forward; in backward its gradient passes through, `aux` (a scalar, or undefined) gets `weight` (or 1)
// and the slots this forward routed are added to `counted`: once per backward, however often a recomputation
// re-ran the forward.
Tensor carry_aux_loss(const Tensor& y, const Tensor& aux, const Tensor& weight, MoE::Counts counts,
                      std::shared_ptr<MoE::Counts> counted) {
  Tensor out = y.detach();
  return autograd::record("moe_aux_loss", {y, aux}, out,
                          [aux_defined = aux.defined(), aux_dtype = aux.defined() ? aux.dtype() : DType::f32,
                           device = y.device(), weight, counts = std::move(counts), counted](const Tensor& g) {
                            for (size_t e = 0; e < counts.routed.size(); ++e) {
                              counted->routed[e] += counts.routed[e];
                              counted->kept[e] += counts.kept[e];
                            }
                            Tensor da;
                            if (aux_defined)
                              da = weight.defined() ? ops::cast(weight, aux_dtype).reshape({})
                                                    : Tensor::ones({}, aux_dtype, device);
                            return std::vector<Tensor>{g, da};
                          });
}

}  // namespace

MoE::MoE(const GPTConfig& cfg, uint64_t dropout_stream, std::shared_ptr<const DropoutContext> dropout_ctx,
         std::shared_ptr<const MoEContext> ctx, int64_t block)
    : cfg_(cfg),
      block_(block),
      ctx_(std::move(ctx)),
      counted_(std::make_shared<Counts>(Counts{std::vector<double>(size_t(cfg.moe_experts), 0.0),
                                               std::vector<double>(size_t(cfg.moe_experts), 0.0)})),
      last_(std::make_shared<Routing>()),
      last_aux_(std::make_shared<Tensor>()),
      last_logits_(std::make_shared<Tensor>()) {
  const int64_t C = cfg.n_embd, E = cfg.moe_experts;
  router = register_module("router", std::make_shared<Linear>(C, E, false));
  expert_bias = register_buffer("expert_bias", Tensor::zeros({E}));
  experts = register_module("experts", std::make_shared<ModuleList<LlamaMLP>>());
  const GPTConfig one = expert_config(cfg, cfg.mlp_width());
  for (int64_t e = 0; e < E; ++e) experts->push_back(std::make_shared<LlamaMLP>(one, dropout_stream, dropout_ctx));
  if (cfg.moe_shared > 0)
    shared = register_module("shared", std::make_shared<LlamaMLP>(expert_config(cfg, cfg.moe_shared * cfg.mlp_width()),
                                                                  dropout_stream, dropout_ctx));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout, dropout_stream, dropout_ctx));
}

Tensor MoE::forward(const Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T, E = cfg_.moe_experts, K = cfg_.moe_top_k;
  const Device device = x.device();
  const Tensor xf = x.reshape({N, C});
  const bool sigmoid_router = cfg_.moe_router == GPTConfig::Router::kSigmoid;

  // The router in f32 whatever autocast says (torchtitan's and Megatron's choice): 16-bit logits would flip the
  // top-k choice of near-tied experts, and the gates multiply every expert's output.
  Tensor scores;
  {
    const autograd::AutocastGuard full(DType::f32);
    const DType rt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const Tensor logits = router->forward(autograd::autocast_to(xf, rt));
    *last_logits_ = logits.detach();
    scores = sigmoid_router ? tanh(logits * 0.5) * 0.5 + 0.5 : softmax(logits);  // (N, E)
  }

  // The choice, on the host: scores (+ the bias, which only chooses).
  std::vector<double> choice = scores.detach().to_vector();
  if (cfg_.moe_balance == GPTConfig::Balance::kBias) {
    const std::vector<double> bias = expert_bias.to_vector();
    for (int64_t t = 0; t < N; ++t)
      for (int64_t e = 0; e < E; ++e) choice[size_t(t * E + e)] += bias[size_t(e)];
  }
  *last_ = route(choice, N, E, K, expert_capacity(cfg_.moe_capacity, T, K, E), T);
  const Routing& r = *last_;

  // Gates: the chosen scores, renormalised over a token's k choices.
  std::vector<int64_t> flat(size_t(N * K));
  for (int64_t s = 0; s < N * K; ++s) flat[size_t(s)] = (s / K) * E + r.expert[size_t(s)];
  Tensor gates = gather_rows(scores.reshape({N * E, 1}), index_tensor(flat, device)).reshape({N, K});
  if (K > 1) gates = gates / sum(gates, 1, true);

  // Dispatch: each kept slot's token row, expert-major; one GEMM chain per expert over its block of rows.
  std::vector<int64_t> token_of_row(r.order.size());
  for (size_t i = 0; i < r.order.size(); ++i) token_of_row[i] = r.order[i] / K;
  // Every expert runs, on however many rows it got, none included: each parameter then has a gradient (zeros for
  // an expert no token chose) in every backward, as DDP's and ZeRO's buckets expect.
  const Tensor rows = gather_rows(xf, index_tensor(token_of_row, device));
  Tensor ran;
  if (style) {
    ran = style->run(rows, r.kept, [this](int64_t e, const Tensor& in) { return expert(e).forward(in); });
  } else {
    std::vector<Tensor> outs;
    int64_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      outs.push_back(expert(e).forward(rows.narrow(0, at, r.kept[size_t(e)])));
      at += r.kept[size_t(e)];
    }
    ran = cat(outs, 0);
  }
  // Combine: every slot's expert row (a dropped slot's: the zero row appended last), weighted, summed per token.
  const DType act = ran.dtype();
  const Tensor expert_rows = cat({ran, Tensor::zeros({1, C}, act, device)}, 0);
  std::vector<int64_t> slot_rows(size_t(N * K));
  for (int64_t s = 0; s < N * K; ++s)
    slot_rows[size_t(s)] = r.row[size_t(s)] >= 0 ? r.row[size_t(s)] : int64_t(r.order.size());
  const Tensor slots = gather_rows(expert_rows, index_tensor(slot_rows, device)).reshape({N, K, C});
  // (summed in f32 under autocast, as every reduction, and rounded once back to the experts' dtype: the residual
  // stream stays 16-bit)
  Tensor y = autograd::autocast_to(sum(slots * autograd::autocast_to(gates, act).reshape({N, K, 1}), 1), act);
  if (shared) y = y + shared->forward(xf);

  // The auxiliary loss of these B sequences: mean over sequences of α·E·Σᵢ fᵢ Pᵢ.
  Tensor aux;
  if (cfg_.moe_balance == GPTConfig::Balance::kAux) {
    std::vector<double> f(size_t(B * E), 0.0);
    for (int64_t s = 0; s < N * K; ++s) f[size_t((s / K / T) * E + r.expert[size_t(s)])] += 1.0 / double(T);
    Tensor probs = sigmoid_router ? scores / sum(scores, 1, true) : scores;
    const Tensor P = mean(probs.reshape({B, T, E}), 1);  // (B, E)
    const Tensor fi = Tensor::from_vector(f, {B, E}, P.dtype()).to(device);
    aux = sum(P * fi) * (cfg_.moe_aux_coef * double(E) / double(B));
  }
  *last_aux_ = aux.defined() ? aux.detach() : Tensor();
  Counts counts{{r.routed.begin(), r.routed.end()}, {r.kept.begin(), r.kept.end()}};
  y = carry_aux_loss(y, aux, ctx_ ? ctx_->aux_weight : Tensor(), std::move(counts), counted_);
  return dropout->forward(y.reshape({B, T, C}));
}

void MoE::keep_experts(int64_t first, int64_t count) {
  MINIDL_CHECK(count >= 1 && holds(first) && holds(first + count - 1), "MoE::keep_experts: experts [", first, ", ",
               first + count, ") are not all held here");
  auto kept = std::make_shared<ModuleList<LlamaMLP>>(first);
  for (int64_t e = first; e < first + count; ++e) kept->push_back(*(experts->begin() + (e - experts->first_index())));
  experts = kept;
  replace_module("experts", experts);
}

MoE::Counts MoE::take_counts() const {
  Counts out = *counted_;
  std::fill(counted_->routed.begin(), counted_->routed.end(), 0.0);
  std::fill(counted_->kept.begin(), counted_->kept.end(), 0.0);
  return out;
}

void MoE::update_bias(const std::vector<double>& counts, double rate) {
  const int64_t E = cfg_.moe_experts;
  MINIDL_CHECK(int64_t(counts.size()) == E, "MoE::update_bias: expected ", E, " counts, got ", counts.size());
  const double mean = std::accumulate(counts.begin(), counts.end(), 0.0) / double(E);
  std::vector<double> delta(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double d = mean - counts[size_t(e)];
    delta[size_t(e)] = rate * double((d > 0) - (d < 0));
  }
  const double centre = std::accumulate(delta.begin(), delta.end(), 0.0) / double(E);
  std::vector<double> bias = expert_bias.to_vector();
  for (int64_t e = 0; e < E; ++e) bias[size_t(e)] += delta[size_t(e)] - centre;
  expert_bias.copy_(Tensor::from_vector(bias, {E}, expert_bias.dtype()).to(expert_bias.device()));
}

MoE::Load MoE::finish_step(const Counts& c) {
  if (cfg_.moe_balance == GPTConfig::Balance::kBias) update_bias(c.routed, cfg_.moe_bias_rate);
  double routed = 0, kept = 0, most = 0;
  for (size_t e = 0; e < c.routed.size(); ++e)
    routed += c.routed[e], kept += c.kept[e], most = std::max(most, c.kept[e]);
  Load load;
  load.block = block_;
  load.max_over_mean = kept > 0 ? most / (kept / double(c.kept.size())) : 0;
  load.dropped_fraction = routed > 0 ? 1 - kept / routed : 0;
  load.aux_loss = last_aux_->defined() ? last_aux_->item() : 0;
  return load;
}

std::vector<MoE*> moe_layers(const GPT& model) {
  std::vector<MoE*> out;
  if (!model.config().moe() || !model.h) return out;
  for (size_t i = 0; i < model.h->size(); ++i)
    if (const auto* b = dynamic_cast<const LlamaBlock*>(&(*model.h)[i]); b && b->moe) out.push_back(b->moe.get());
  return out;
}

}  // namespace minidl::nn
