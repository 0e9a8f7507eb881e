// Module: recursive dotted names, state dicts and their errors, train/eval, zero_grad; GPT's Hugging Face names.
#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "nn/layers.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;

namespace {

struct Net : Module {
  Net() {
    MemoryTagGuard tag(MemTag::kParams);
    scale = register_parameter("scale", Tensor::ones({3}));
    fc = register_module("fc", std::make_shared<Linear>(3, 2));
    steps = register_buffer("steps", Tensor::zeros({1}));
    norm = register_module("norm", std::make_shared<LayerNorm>(2));
  }
  Tensor scale, steps;
  std::shared_ptr<Linear> fc;
  std::shared_ptr<LayerNorm> norm;
};

std::vector<std::string> names(const NamedTensors& list) {
  std::vector<std::string> out;
  for (const auto& [n, _] : list) out.push_back(n);
  return out;
}

}  // namespace

TEST(Module, NamesAreDottedAndInRegistrationOrder) {
  Net net;
  EXPECT_EQ(names(net.named_parameters()),
            (std::vector<std::string>{"scale", "fc.weight", "fc.bias", "norm.weight", "norm.bias"}));
  EXPECT_EQ(names(net.named_buffers()), (std::vector<std::string>{"steps"}));
  EXPECT_EQ(net.parameters().size(), 5u);
  EXPECT_EQ(net.num_parameters(), 3 + 6 + 2 + 2 + 2);
  EXPECT_EQ(net.state_dict().size(), 6u);
  for (auto& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(net.steps.requires_grad());
  EXPECT_TRUE(net.named_parameters()[1].second.same(net.fc->weight));  // the member is the registered tensor
  EXPECT_EQ(net.fc->weight.shape(), (Shape{3, 2}));                    // (in, out): the GPT-2 Conv1D layout
}

TEST(Module, RejectsBadAndDuplicateNames) {
  Net net;
  expect_error([&] { net.register_parameter("scale", Tensor::ones({1})); }, {"'scale'", "already registered"});
  expect_error([&] { net.register_buffer("fc", Tensor::ones({1})); }, {"'fc'", "already registered"});
  expect_error([&] { net.register_parameter("a.b", Tensor::ones({1})); }, {"'a.b'", "no '.'"});
}

TEST(Module, TrainAndEvalReachEveryChild) {
  Net net;
  EXPECT_TRUE(net.fc->is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.fc->is_training());
  EXPECT_FALSE(net.norm->is_training());
  net.train();
  EXPECT_TRUE(net.norm->is_training());
}

TEST(Module, LoadStateDictCopiesInPlace) {
  Net a, b;
  a.fc->weight.fill_(0.5);
  a.steps.fill_(7);
  Tensor storage_before = b.fc->weight;
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.fc->weight.to_vector(), std::vector<double>(6, 0.5));
  EXPECT_EQ(b.steps.item(), 7.0);
  EXPECT_TRUE(b.fc->weight.same(storage_before));
  EXPECT_FALSE(b.fc->weight.shares_storage(a.fc->weight));
}

TEST(Module, LoadStateDictListsMissingUnexpectedAndMismatched) {
  Net net;
  StateDict dict = net.state_dict();
  dict.erase("fc.bias");
  dict.erase("norm.weight");
  dict["fc.extra"] = Tensor::zeros({4});
  dict["scale"] = Tensor::zeros({5});
  expect_error([&] { net.load_state_dict(dict); },
               {"missing", "fc.bias expected shape (2,)", "norm.weight", "unexpected", "fc.extra found shape (4,)",
                "scale: expected shape (3,), found (5,)"});

  // Non-strict tolerates missing and unexpected names, never a shape mismatch.
  expect_error([&] { net.load_state_dict(dict, /*strict=*/false); }, {"scale: expected shape (3,), found (5,)"});
  dict["scale"] = Tensor::full({3}, 2.0);
  net.load_state_dict(dict, /*strict=*/false);
  EXPECT_EQ(net.scale.to_vector(), std::vector<double>(3, 2.0));
}

TEST(Module, ZeroGradKeepsGradientStorage) {
  Net net;
  Tensor g = Tensor::full({3, 2}, 1.0);
  net.fc->weight.set_grad(g);
  net.zero_grad();
  EXPECT_TRUE(net.fc->weight.grad().same(g));
  EXPECT_EQ(g.to_vector(), std::vector<double>(6, 0.0));
  EXPECT_FALSE(net.scale.grad().defined());
}

TEST(Module, GPTHasHuggingFaceNamesInOrder) {
  GPTConfig cfg{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 12};
  GPT model(cfg);
  std::vector<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    std::string p = "transformer.h." + std::to_string(i) + ".";
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      expected.push_back(p + s);
  }
  expected.push_back("transformer.ln_f.weight");
  expected.push_back("transformer.ln_f.bias");
  EXPECT_EQ(names(model.named_parameters()), expected);

  const int64_t C = 12, V = 11, L = 2;
  const int64_t per_block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  EXPECT_EQ(model.num_parameters(), V * C + 8 * C + L * per_block + 2 * C);
  EXPECT_EQ(model.h->size(), 2u);
  EXPECT_EQ(model.block<nn::Block>(1).attn->c_attn->weight.shape(), (Shape{C, 3 * C}));
  EXPECT_EQ(model.block<nn::Block>(0).mlp->c_proj->weight.shape(), (Shape{4 * C, C}));
}

// Layers built alone start from PyTorch's default initialisation (a Linear that started at zero trained a user's
// MLP to a flat loss with no warning): Linear's weight and bias in U(-1/sqrt(in), 1/sqrt(in)), Embedding's weight
// N(0, 1); the same for the same manual_seed and construction order, different for each layer; and nothing is
// drawn under SkipDefaultInit (GPT initialises every parameter itself, its biases to zero).
TEST(Layers, DefaultInitialisationIsPyTorchsAndDeterministic) {
  manual_seed(5);
  Linear a(64, 32), b(64, 32);
  Embedding e(100, 16);
  const double bound = 1.0 / 8.0;
  for (const Tensor& t : {a.weight, a.bias}) {
    const std::vector<double> v = t.to_vector();
    double lo = 1, hi = -1;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x);
    EXPECT_GE(lo, -bound);
    EXPECT_LT(hi, bound);
    EXPECT_GT(hi - lo, 1.5 * bound) << "the values fill the range";
  }
  EXPECT_NE(a.weight.to_vector(), b.weight.to_vector()) << "each layer draws its own stream";
  double sum = 0, sq = 0;
  for (double x : e.weight.to_vector()) sum += x, sq += x * x;
  EXPECT_NEAR(sum / 1600, 0.0, 0.1);
  EXPECT_NEAR(sq / 1600, 1.0, 0.1);
  manual_seed(5);
  Linear again(64, 32);
  EXPECT_EQ(again.weight.to_vector(), a.weight.to_vector());
  EXPECT_EQ(again.bias.to_vector(), a.bias.to_vector());
  {
    SkipDefaultInit skip;
    Linear zero(4, 3);
    for (double x : zero.weight.to_vector()) EXPECT_EQ(x, 0.0);
  }
  GPTConfig cfg{.vocab_size = 11, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  GPT gpt(cfg, /*seed=*/1);
  for (double x : gpt.block<nn::Block>(0).attn->c_attn->bias.to_vector())
    EXPECT_EQ(x, 0.0) << "GPT-2's biases start at zero";
}
