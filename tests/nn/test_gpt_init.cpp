// GPT construction: nanoGPT's initialisation statistics, determinism from the seed, config errors, the memory
// ledger and the FLOP estimate. None of this runs a forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "nn/gpt.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;

namespace {

const GPTConfig kStatsConfig{.vocab_size = 512, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64};

struct Stats {
  double mean, std;
};

Stats stats(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  double s = 0, s2 = 0;
  for (double x : v) s += x;
  double mean = s / double(v.size());
  for (double x : v) s2 += (x - mean) * (x - mean);
  return {mean, std::sqrt(s2 / double(v.size()))};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST(GPTInit, MatchesNanoGPTStatistics) {
  GPT model(kStatsConfig, 1337);
  const double residual_std = 0.02 / std::sqrt(2.0 * kStatsConfig.n_layer);
  int checked = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (ends_with(name, ".bias")) {
      EXPECT_EQ(stats(p).std, 0.0) << name;
      EXPECT_EQ(stats(p).mean, 0.0) << name;
    } else if (p.dim() == 1) {  // LayerNorm weights
      EXPECT_EQ(p.to_vector(), std::vector<double>(size_t(p.numel()), 1.0)) << name;
    } else {
      bool residual = ends_with(name, "c_proj.weight");
      double want = residual ? residual_std : 0.02;
      Stats s = stats(p);
      // Every weight has >= 4096 elements: the sample std is within a few percent of the true one.
      EXPECT_NEAR(s.std, want, 0.05 * want) << name;
      EXPECT_NEAR(s.mean, 0.0, 4 * want / std::sqrt(double(p.numel()))) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 + 4 * kStatsConfig.n_layer);
}

TEST(GPTInit, IsAFunctionOfTheSeed) {
  GPT a(kStatsConfig, 7), b(kStatsConfig, 7), c(kStatsConfig, 8);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(pa[i].second, pb[i].second)) << pa[i].first;
    if (pa[i].second.dim() == 2) EXPECT_FALSE(bitwise_equal(pa[i].second, pc[i].second)) << pa[i].first;
  }
  // Each parameter has its own stream: two same-shaped weights differ.
  EXPECT_FALSE(bitwise_equal(a.block<nn::Block>(0).attn->c_attn->weight, a.block<nn::Block>(1).attn->c_attn->weight));
}

TEST(GPTInit, ParametersAreChargedToTheParamsTag) {
  int64_t before = ledger().current(MemTag::kParams);
  auto model = std::make_unique<GPT>(kStatsConfig);
  EXPECT_EQ(ledger().current(MemTag::kParams) - before, model->num_parameters() * int64_t(sizeof(float)));
  model.reset();
  EXPECT_EQ(ledger().current(MemTag::kParams), before);
}

TEST(GPTInit, BadConfigsNameTheField) {
  GPTConfig cfg = kStatsConfig;
  cfg.n_embd = 62;
  expect_error([&] { GPT m(cfg); }, {"n_embd", "n_head (4)", "got n_embd = 62"});
  cfg = kStatsConfig;
  cfg.vocab_size = 0;
  expect_error([&] { GPT m(cfg); }, {"vocab_size > 0", "got 0"});
  cfg = kStatsConfig;
  cfg.dropout = 1.0;
  expect_error([&] { GPT m(cfg); }, {"dropout", "got 1"});
}

TEST(GPTInit, FlopsPerTokenIsNanoGPTsEstimate) {
  GPT model(kStatsConfig);
  const double L = 4, C = 64, T = 32;
  const double n = double(model.num_parameters() - kStatsConfig.block_size * kStatsConfig.n_embd);
  EXPECT_DOUBLE_EQ(model.flops_per_token(32), 6 * n + 12 * L * C * T);
}
