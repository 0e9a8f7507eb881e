// Generation with a KV cache (nn::GPT::forward_cached, train::generate) against the window recomputed for every
// token (the uncached path, forward() itself): the cache's first call is forward() bit for bit; each later position's
// logits agree within f32 rounding (the cache sums the attention in another order); and the generated tokens are
// the same, greedy and sampled (temperature, top-k), through a window that fills and slides. Built into the CPU
// tests and into the device tests (tests/support/test_device.h), where the model lives on the (emulated) GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/node.h"
#include "core/error.h"
#include "core/memory.h"
#include "nn/gpt.h"
#include "tests/support/test_device.h"
#include "train/evaluate.h"
#include "train/zero_memory.h"

namespace minidl {
namespace {

// block_size 24: 60 new tokens after a 5-token prompt fill the window and slide it.
nn::GPTConfig generation_config() { return nn::GPTConfig{37, 24, 2, 2, 32, 0.0, true}; }

std::vector<int32_t> prompt() { return {3, 14, 15, 9, 26}; }

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    diff = std::max(diff, std::abs(a[i] - b[i]));
  }
  return diff / scale;
}

TEST(Generate, CachedLogitsAreTheWindowsLogits) {
  SKIP_WITHOUT_DEVICE();
  nn::GPT model(generation_config(), 5);
  model.to(testing::test_device());
  model.eval();
  autograd::NoGradGuard no_grad;
  const Device device = testing::test_device();
  std::vector<int32_t> tokens = prompt();
  nn::KVCache cache;
  const Tensor ids = Tensor::from_vector(tokens, Shape{1, int64_t(tokens.size())}).to(device);
  EXPECT_EQ(model.forward_cached(ids, cache).to_vector(), model.forward(ids).to_vector()) << "the first call";
  for (int32_t next = 1; int64_t(tokens.size()) < model.config().block_size; next = (next * 7 + 3) % 37) {
    tokens.push_back(next);
    const std::vector<double> cached =
        model.forward_cached(Tensor::from_vector(std::vector<int32_t>{next}, Shape{1, 1}).to(device), cache)
            .to_vector();
    const Tensor window = Tensor::from_vector(tokens, Shape{1, int64_t(tokens.size())}).to(device);
    const Tensor all = model.forward(window);
    const std::vector<double> want = all.narrow(1, all.size(1) - 1, 1).to_vector();
    // f32 attention over at most 24 positions summed in another order: a few 2^-24 of the logits' size.
    EXPECT_LE(max_relative(cached, want), 1e-5) << "position " << tokens.size() - 1;
  }
  EXPECT_EQ(cache.length, model.config().block_size);
  try {
    model.forward_cached(Tensor::from_vector(std::vector<int32_t>{1}, Shape{1, 1}).to(device), cache);
    ADD_FAILURE() << "a position past block_size was accepted";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("block_size = 24"), std::string::npos) << e.what(); }
}

TEST(Generate, CachedTokensEqualRecomputedOnesGreedyAndSampled) {
  SKIP_WITHOUT_DEVICE();
  nn::GPT model(generation_config(), 5);
  model.to(testing::test_device());
  struct Case {
    double temperature;
    int64_t top_k;
  };
  for (Case c : {Case{0, 0}, Case{1.0, 0}, Case{0.7, 5}, Case{1.3, 1}}) {
    SCOPED_TRACE("temperature " + std::to_string(c.temperature) + " top_k " + std::to_string(c.top_k));
    train::GenerateOptions o;
    o.max_new_tokens = 60;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.seed = 11;
    const std::vector<int32_t> cached = train::generate(model, prompt(), o);
    o.kv_cache = false;
    const std::vector<int32_t> recomputed = train::generate(model, prompt(), o);
    ASSERT_EQ(cached.size(), prompt().size() + 60);
    const std::vector<int32_t> start = prompt();
    EXPECT_TRUE(std::equal(start.begin(), start.end(), cached.begin())) << "the prompt leads the output";
    EXPECT_EQ(cached, recomputed);
  }
  // top-k 1 at any temperature is greedy.
  train::GenerateOptions greedy, top1;
  greedy.temperature = 0;
  top1.top_k = 1;
  top1.seed = 99;
  greedy.max_new_tokens = top1.max_new_tokens = 30;
  EXPECT_EQ(train::generate(model, prompt(), top1), train::generate(model, prompt(), greedy));
}

// The cache's bytes are what train::kv_cache_bytes predicts, n_kv_head heads per block: a Llama with 2 of 6 heads
// keeps a third of the multi-head model's.
TEST(Generate, KVCacheBytesAreThePredictedOnes) {
  SKIP_WITHOUT_DEVICE();
  nn::GPTConfig mha{37, 24, 2, 6, 96, 0.0, false};  // head_dim 16, which the CUDA kernels take
  mha.arch = nn::GPTConfig::Arch::kLlama;
  nn::GPTConfig gqa = mha;
  gqa.n_kv_head = 2;
  EXPECT_EQ(3 * train::kv_cache_bytes(gqa, DType::f32), train::kv_cache_bytes(mha, DType::f32));
  for (const nn::GPTConfig& cfg : {generation_config(), mha, gqa}) {
    nn::GPT model(cfg, 5);
    model.to(testing::test_device());
    model.eval();
    autograd::NoGradGuard no_grad;
    const MemoryLedger& mem = ledger(testing::test_device());
    const int64_t before = mem.current(MemTag::kActivations);
    nn::KVCache cache;
    model.forward_cached(Tensor::from_vector(prompt(), {1, int64_t(prompt().size())}).to(testing::test_device()),
                         cache);
    EXPECT_EQ(double(mem.current(MemTag::kActivations) - before), train::kv_cache_bytes(cfg, DType::f32))
        << "kv heads " << cfg.kv_heads();
  }
}

TEST(Generate, BadOptionsAreRefusedByName) {
  nn::GPT model(generation_config(), 5);
  train::GenerateOptions o;
  EXPECT_THROW(train::generate(model, {}, o), Error);
  o.temperature = -1;
  EXPECT_THROW(train::generate(model, prompt(), o), Error);
}

}  // namespace
}  // namespace minidl
