// GPT in pieces: embed / blocks / head_loss compose to loss bitwise; two stage models chained equal the whole model
// (names, initial values, loss, gradients); initialisation by global parameter index, also for row and column
// slices of a parameter; and the block hooks' call order under every recompute setting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/gpt.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;

namespace {

GPTConfig config() { return {/*vocab*/ 23, /*block*/ 16, /*layers*/ 4, /*heads*/ 2, /*embd*/ 32, 0.2, true}; }

Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int32_t> v(size_t(B * T));
  Philox rng(seed, 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(rng.draw(i).x % 23u);
  return Tensor::from_vector(v, Shape{B, T});
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::map<std::string, Tensor> by_name(const GPT& m) {
  std::map<std::string, Tensor> out;
  for (auto& [name, p] : m.named_parameters()) out.emplace(name, p);
  return out;
}

}  // namespace

TEST(GPTStages, PiecesComposeToLossBitwise) {
  GPT model(config(), 3);
  model.train();
  model.dropout_context().step = 2;
  Tensor x = tokens(2, 16, 1), y = tokens(2, 16, 2);
  Tensor whole = model.loss(x, y);
  Tensor pieces = model.head_loss(model.blocks(2, 4, model.blocks(0, 2, model.embed(x))), y);
  EXPECT_TRUE(bitwise_equal(whole, pieces));
  EXPECT_TRUE(bitwise_equal(model.forward(x), model.head(model.blocks(0, 4, model.embed(x)))));
}

TEST(GPTStages, TwoStagesEqualTheWholeModel) {
  const GPTConfig cfg = config();
  for (Recompute mode : {Recompute::kNone, Recompute::kBlock}) {
    SCOPED_TRACE(recompute_name(mode));
    GPT whole(cfg, 9);
    GPT first(cfg, 9, {.first_block = 0, .last_block = 2, .embedding = true, .head = false});
    GPT last(cfg, 9, {.first_block = 2, .last_block = -1, .embedding = false, .head = true});
    for (GPT* m : {&whole, &first, &last}) {
      m->train();
      m->set_recompute(mode);
      m->dropout_context().step = 5;
    }
    EXPECT_EQ(last.stage().last_block, cfg.n_layer);

    // Same names and initial values; wte lives on both stages.
    auto all = by_name(whole), a = by_name(first), b = by_name(last);
    EXPECT_EQ(a.size() + b.size(), all.size() + 1);
    EXPECT_TRUE(a.count("transformer.wte.weight") && b.count("transformer.wte.weight"));
    EXPECT_TRUE(a.count("transformer.h.1.mlp.c_fc.weight") && !a.count("transformer.h.2.ln_1.weight"));
    EXPECT_TRUE(b.count("transformer.h.2.ln_1.weight") && b.count("transformer.h.3.attn.c_proj.weight"));
    EXPECT_TRUE(!b.count("transformer.wpe.weight") && !a.count("transformer.ln_f.weight"));
    for (auto* stage : {&a, &b})
      for (auto& [name, p] : *stage) {
        ASSERT_TRUE(all.count(name)) << name;
        EXPECT_TRUE(bitwise_equal(p, all.at(name))) << name;
      }

    // Chained: the same loss and the same gradients (wte's is the sum of the two copies').
    Tensor x = tokens(2, 16, 3), y = tokens(2, 16, 4);
    Tensor loss = whole.loss(x, y);
    loss.backward();
    Tensor act = first.blocks(0, 2, first.embed(x));
    Tensor boundary = act.detach().set_requires_grad(true);  // what a pipeline sends between ranks
    Tensor staged = last.head_loss(last.blocks(2, 4, boundary), y);
    EXPECT_TRUE(bitwise_equal(loss, staged));
    staged.backward();
    act.backward(boundary.grad());

    for (auto* stage : {&a, &b})
      for (auto& [name, p] : *stage) {
        if (name == "transformer.wte.weight") continue;
        EXPECT_TRUE(bitwise_equal(p.grad(), all.at(name).grad())) << name;
      }
    Tensor wte_grad = a.at("transformer.wte.weight").grad() + b.at("transformer.wte.weight").grad();
    std::vector<double> want = all.at("transformer.wte.weight").grad().to_vector(), got = wte_grad.to_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  }
}

TEST(GPTStages, StageChecksItsParts) {
  const GPTConfig cfg = config();
  GPT mid(cfg, 1, {.first_block = 1, .last_block = 3, .embedding = false, .head = false});
  EXPECT_EQ(mid.wte, nullptr);
  EXPECT_EQ(mid.h->size(), 2u);
  EXPECT_EQ(mid.h->first_index(), 1);
  Tensor x = Tensor::zeros({1, 4, cfg.n_embd});
  expect_error([&] { mid.blocks(0, 2, x); }, {"GPT::blocks", "[1, 3)", "got [0, 2)"});
  expect_error([&] { mid.blocks(2, 4, x); }, {"[1, 3)", "got [2, 4)"});
  expect_error([&] { mid.embed(tokens(1, 4, 1)); }, {"does not hold the embedding"});
  expect_error([&] { mid.head(x); }, {"does not hold the head"});
  expect_error([&] { GPT bad(cfg, 1, {.first_block = 3, .last_block = 5}); }, {"n_layer = 4", "got [3, 5)"});
  EXPECT_EQ(mid.blocks(1, 3, x).shape(), x.shape());
}

// The whole model's parameter k still draws from stream k (the documented init, unchanged by keying on names).
TEST(GPTStages, WholeModelInitIsStreamPerParameterPosition) {
  const GPTConfig cfg = config();
  GPT model(cfg, 11);
  NamedTensors params = model.named_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto& [name, p] = params[k];
    if (p.dim() != 2) continue;
    bool residual = name.find("c_proj.weight") != std::string::npos;
    Tensor want = Tensor::zeros(p.shape());
    init_normal(want, residual ? 0.02 / std::sqrt(2.0 * cfg.n_layer) : 0.02, 11, k);
    EXPECT_TRUE(bitwise_equal(p, want)) << name;
  }
}

TEST(GPTStages, InitSliceEqualsTheSliceOfTheWholeParameter) {
  const Shape full_shape{12, 40};
  Tensor full = Tensor::zeros(full_shape);
  init_normal(full, 0.02, 5, 17);

  // Rows [3, 8): the offset form and the slice form.
  Tensor rows = Tensor::zeros({5, 40}), rows2 = Tensor::zeros({5, 40});
  init_normal(rows, 0.02, 5, 17, /*first_element=*/3 * 40);
  init_normal_slice(rows2, 0.02, 5, 17, full_shape, /*dim=*/0, /*start=*/3);
  EXPECT_TRUE(bitwise_equal(rows, full.narrow(0, 3, 5).contiguous()));
  EXPECT_TRUE(bitwise_equal(rows2, full.narrow(0, 3, 5).contiguous()));

  // Columns [10, 30).
  Tensor cols = Tensor::zeros({12, 20});
  init_normal_slice(cols, 0.02, 5, 17, full_shape, /*dim=*/1, /*start=*/10);
  EXPECT_TRUE(bitwise_equal(cols, full.narrow(1, 10, 20).contiguous()));

  expect_error([&] { init_normal_slice(cols, 0.02, 5, 17, full_shape, 1, 25); }, {"not a slice of", "(12, 40)"});
}

namespace {

struct Recorder : BlockHooks {
  std::vector<std::string> calls;
  void before_block(int64_t b, bool recompute) override {
    calls.push_back((recompute ? "R" : "F") + ("+" + std::to_string(b)));
  }
  void after_block(int64_t b, bool recompute) override {
    calls.push_back((recompute ? "R" : "F") + ("-" + std::to_string(b)));
  }
  void before_block_backward(int64_t b) override { calls.push_back("B" + std::to_string(b)); }
};

}  // namespace

TEST(GPTStages, BlockHooksOrder) {
  const GPTConfig cfg = config();
  const std::vector<std::string> forward = {"F+0", "F-0", "F+1", "F-1", "F+2", "F-2", "F+3", "F-3"};
  for (Recompute mode : {Recompute::kNone, Recompute::kAttn, Recompute::kMlp, Recompute::kBlock}) {
    SCOPED_TRACE(recompute_name(mode));
    GPT model(cfg, 2);
    model.train();
    model.set_recompute(mode);
    Recorder hooks;
    model.set_block_hooks(&hooks);
    // Each block's parameters must get their gradients after before_block_backward of that block.
    std::vector<std::string> grads_before_hook;
    for (auto& [name, p] : model.named_parameters()) {
      if (name.rfind("transformer.h.", 0) != 0) continue;
      const std::string block = name.substr(14, name.find('.', 14) - 14);
      p.register_grad_ready_hook([&hooks, &grads_before_hook, block, name = name](Tensor&) {
        if (std::find(hooks.calls.begin(), hooks.calls.end(), "B" + block) == hooks.calls.end())
          grads_before_hook.push_back(name);
      });
    }
    Tensor loss = model.loss(tokens(2, 8, 1), tokens(2, 8, 2));
    EXPECT_EQ(hooks.calls, forward);
    hooks.calls.clear();
    loss.backward();
    std::vector<std::string> want;
    for (int b = 3; b >= 0; --b) {
      want.push_back("B" + std::to_string(b));
      if (mode != Recompute::kNone) {
        want.push_back("R+" + std::to_string(b));
        want.push_back("R-" + std::to_string(b));
      }
    }
    EXPECT_EQ(hooks.calls, want);
    EXPECT_TRUE(grads_before_hook.empty()) << grads_before_hook.front();
  }
}

TEST(GPTStages, HooksDoNotChangeResults) {
  GPT plain(config(), 4), hooked(config(), 4);
  Recorder hooks;
  hooked.set_block_hooks(&hooks);
  for (GPT* m : {&plain, &hooked}) m->set_recompute(Recompute::kBlock);
  Tensor x = tokens(2, 8, 5), y = tokens(2, 8, 6);
  Tensor a = plain.loss(x, y), b = hooked.loss(x, y);
  EXPECT_TRUE(bitwise_equal(a, b));
  a.backward();
  b.backward();
  auto pa = plain.parameters(), pb = hooked.parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bitwise_equal(pa[i].grad(), pb[i].grad())) << i;
}
