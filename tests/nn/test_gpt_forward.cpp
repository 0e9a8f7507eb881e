// GPT forward pass against a plain, unfused reference written here in double-precision loops: embedding lookup,
// the LayerNorm formula, x @ W + b, an explicit T x T causal softmax per head, tanh-GELU, the tied head and
// cross-entropy. Plus the input errors, dropout's determinism and a backward that reaches every parameter.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "nn/gpt.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;

namespace {

const GPTConfig kTiny{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 12};
constexpr int64_t kB = 2, kT = 5;

using Mat = std::vector<std::vector<double>>;  // rows of a (rows, cols) activation

// Every parameter gets random values (biases and LayerNorm included), so the reference exercises all of them.
void randomise(GPT& model, uint64_t seed) {
  auto params = model.named_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto& [name, p] = params[k];
    float* d = p.data<float>();
    Philox rng(seed, k);
    bool ln_weight = p.dim() == 1 && name.find("ln_") != std::string::npos && name.find("weight") != std::string::npos;
    for (int64_t i = 0; i < p.numel(); ++i) d[i] = (ln_weight ? 1.0f : 0.0f) + 0.3f * rng.normal(uint64_t(i));
  }
}

struct Ref {
  const GPT& m;
  std::vector<double> param(const Tensor& t) const { return t.to_vector(); }

  Mat layernorm(const Mat& x, const Tensor& w, const Tensor& b) const {
    auto W = param(w), Bv = param(b);
    Mat y = x;
    for (auto& row : y) {
      double mean = 0, var = 0;
      for (double v : row) mean += v;
      mean /= double(row.size());
      for (double v : row) var += (v - mean) * (v - mean);
      var /= double(row.size());
      for (size_t c = 0; c < row.size(); ++c) row[c] = (row[c] - mean) / std::sqrt(var + 1e-5) * W[c] + Bv[c];
    }
    return y;
  }

  Mat affine(const Mat& x, const Tensor& w, const Tensor& b) const {  // x @ W + b, W: (in, out)
    auto W = param(w), Bv = param(b);
    const size_t in = size_t(w.size(0)), out = size_t(w.size(1));
    Mat y(x.size(), std::vector<double>(out));
    for (size_t r = 0; r < x.size(); ++r)
      for (size_t o = 0; o < out; ++o) {
        double s = Bv[o];
        for (size_t i = 0; i < in; ++i) s += x[r][i] * W[i * out + o];
        y[r][o] = s;
      }
    return y;
  }

  // One sequence (T rows of 3C) -> T rows of C.
  Mat attention(const Mat& qkv, int64_t H) const {
    const size_t T = qkv.size(), C = qkv[0].size() / 3, hs = C / size_t(H);
    Mat y(T, std::vector<double>(C, 0.0));
    for (size_t h = 0; h < size_t(H); ++h)
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> att(t + 1);
        double mx = -1e300, z = 0;
        for (size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (size_t d = 0; d < hs; ++d) dot += qkv[t][h * hs + d] * qkv[s][C + h * hs + d];
          att[s] = dot / std::sqrt(double(hs));
          mx = std::max(mx, att[s]);
        }
        for (auto& a : att) z += (a = std::exp(a - mx));
        for (size_t s = 0; s <= t; ++s)
          for (size_t d = 0; d < hs; ++d) y[t][h * hs + d] += att[s] / z * qkv[s][2 * C + h * hs + d];
      }
    return y;
  }

  static double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

  // ids: B*T values -> logits, B*T rows of V.
  Mat logits(const std::vector<int64_t>& ids, int64_t B, int64_t T) const {
    const auto& cfg = m.config();
    auto wte = param(m.wte->weight), wpe = param(m.wpe->weight);
    const size_t C = size_t(cfg.n_embd);
    Mat out;
    for (int64_t b = 0; b < B; ++b) {
      Mat x(size_t(T), std::vector<double>(C, 0.0));
      for (int64_t t = 0; t < T; ++t)
        for (size_t c = 0; c < C; ++c) x[t][c] = wte[size_t(ids[b * T + t]) * C + c] + wpe[size_t(t) * C + c];
      for (size_t i = 0; i < m.h->size(); ++i) {
        const nn::Block* block = &m.block<nn::Block>(i);
        Mat a = attention(affine(layernorm(x, block->ln_1->weight, block->ln_1->bias), block->attn->c_attn->weight,
                                 block->attn->c_attn->bias),
                          cfg.n_head);
        a = affine(a, block->attn->c_proj->weight, block->attn->c_proj->bias);
        for (int64_t t = 0; t < T; ++t)
          for (size_t c = 0; c < C; ++c) x[t][c] += a[t][c];
        Mat f = affine(layernorm(x, block->ln_2->weight, block->ln_2->bias), block->mlp->c_fc->weight,
                       block->mlp->c_fc->bias);
        for (auto& row : f)
          for (auto& v : row) v = gelu(v);
        f = affine(f, block->mlp->c_proj->weight, block->mlp->c_proj->bias);
        for (int64_t t = 0; t < T; ++t)
          for (size_t c = 0; c < C; ++c) x[t][c] += f[t][c];
      }
      const auto& ln_f = dynamic_cast<const nn::LayerNorm&>(*m.ln_f);
      x = layernorm(x, ln_f.weight, ln_f.bias);
      for (const auto& row : x) {
        std::vector<double> l(size_t(cfg.vocab_size), 0.0);
        for (size_t v = 0; v < l.size(); ++v)
          for (size_t c = 0; c < C; ++c) l[v] += row[c] * wte[v * C + c];
        out.push_back(l);
      }
    }
    return out;
  }
};

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  Philox rng(seed, 5);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(rng.draw(i).x % uint32_t(vocab));
  return ids;
}

}  // namespace

TEST(GPTForward, MatchesTheUnfusedDoubleReference) {
  GPT model(kTiny, 3);
  randomise(model, 42);
  std::vector<int64_t> ids = random_ids(kB * kT, kTiny.vocab_size, 1),
                       targets = random_ids(kB * kT, kTiny.vocab_size, 2);
  Tensor ids_t = Tensor::from_vector(ids, {kB, kT}), targets_t = Tensor::from_vector(targets, {kB, kT});

  Tensor logits = model.forward(ids_t);
  ASSERT_EQ(logits.shape(), (Shape{kB, kT, kTiny.vocab_size}));
  Mat ref = Ref{model}.logits(ids, kB, kT);
  std::vector<double> got = logits.to_vector();
  for (size_t r = 0; r < ref.size(); ++r)
    for (size_t v = 0; v < ref[r].size(); ++v) {
      double want = ref[r][v], have = got[r * ref[r].size() + v];
      EXPECT_NEAR(have, want, 1e-4 * std::max(1.0, std::abs(want))) << "row " << r << " token " << v;
    }

  double ref_loss = 0;
  for (size_t r = 0; r < ref.size(); ++r) {
    double mx = *std::max_element(ref[r].begin(), ref[r].end()), z = 0;
    for (double l : ref[r]) z += std::exp(l - mx);
    ref_loss += mx + std::log(z) - ref[r][size_t(targets[r])];
  }
  ref_loss /= double(ref.size());
  Tensor loss = model.loss(ids_t, targets_t);
  EXPECT_EQ(loss.numel(), 1);
  EXPECT_NEAR(loss.item(), ref_loss, 1e-4 * std::max(1.0, ref_loss));

  // i32 ids give the same logits as i64.
  Tensor ids32 = Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.end()), {kB, kT});
  EXPECT_EQ(model.forward(ids32).to_vector(), got);
}

TEST(GPTForward, BackwardReachesEveryParameter) {
  GPT model(kTiny, 3);
  std::vector<int64_t> ids = random_ids(kB * kT, kTiny.vocab_size, 1);
  model
      .loss(Tensor::from_vector(ids, {kB, kT}), Tensor::from_vector(random_ids(kB * kT, kTiny.vocab_size, 2), {kB, kT}))
      .backward();
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().shape(), p.shape()) << name;
    double norm = 0;
    for (double g : p.grad().to_vector()) norm += g * g;
    EXPECT_GT(norm, 0.0) << name;
  }
}

TEST(GPTForward, WithoutBiasesHasNoBiasParametersAndTrains) {
  GPTConfig cfg = kTiny;
  cfg.bias = false;
  GPT model(cfg, 3);
  for (const auto& [name, p] : model.named_parameters()) EXPECT_EQ(name.find("bias"), std::string::npos) << name;
  EXPECT_EQ(model.named_parameters().size(), 2 + 6 * 2 + 1u);
  Tensor ids = Tensor::from_vector(random_ids(kB * kT, kTiny.vocab_size, 1), {kB, kT});
  Tensor loss = model.loss(ids, ids);
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  for (const auto& [name, p] : model.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
}

TEST(GPTForward, InputErrorsNameExpectedAndGot) {
  GPT model(kTiny);
  expect_error([&] { model.forward(Tensor::zeros({2, 9}, DType::i64)); }, {"block_size = 8", "got T = 9"});
  expect_error([&] { model.forward(Tensor::zeros({10}, DType::i64)); }, {"(B, T)", "(10,)"});
  expect_error([&] { model.forward(Tensor::zeros({1, 3}, DType::f32)); }, {"i32 or i64", "got f32"});
  expect_error(
      [&] {
        model.forward(Tensor::from_vector(std::vector<int64_t>{1, 11, 2}, {1, 3}));
      },
      {"vocab_size = 11", "got 11", "flat index 1"});
  Tensor ids = Tensor::zeros({1, 3}, DType::i64);
  expect_error([&] { model.loss(ids, Tensor::zeros({1, 4}, DType::i64)); }, {"(1, 3)", "got (1, 4)"});
  expect_error(
      [&] {
        model.loss(ids, Tensor::from_vector(std::vector<int64_t>{0, -2, 0}, {1, 3}));
      },
      {"targets", "got -2"});
}

TEST(GPTForward, DropoutMasksFollowTheStepAndVanishInEval) {
  GPTConfig cfg = kTiny;
  cfg.dropout = 0.3;
  GPT with_dropout(cfg, 3), without(kTiny, 3);
  Tensor ids = Tensor::from_vector(random_ids(kB * kT, kTiny.vocab_size, 1), {kB, kT});

  with_dropout.dropout_context().step = 4;
  std::vector<double> a = with_dropout.forward(ids).to_vector();
  std::vector<double> again = with_dropout.forward(ids).to_vector();
  with_dropout.dropout_context().step = 5;
  std::vector<double> next = with_dropout.forward(ids).to_vector();
  EXPECT_EQ(a, again);  // same (seed, step): same masks (what activation checkpointing relies on)
  EXPECT_NE(a, next);

  with_dropout.eval();
  EXPECT_EQ(with_dropout.forward(ids).to_vector(), without.forward(ids).to_vector());
}
