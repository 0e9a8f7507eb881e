#include <gtest/gtest.h>

#include "optim/sgd.h"

using namespace minidl;

static Tensor param(const std::vector<double>& values, const Shape& shape) {
  Tensor p = Tensor::from_vector(values, shape);
  p.set_requires_grad(true);
  return p;
}

static void set_grad(Tensor& p, const std::vector<double>& g) { p.set_grad(Tensor::from_vector(g, p.shape())); }

TEST(SGD, MomentumByHand) {
  Tensor p = param({1.0, -2.0}, {2});
  optim::SGD opt({{{p}, 0.0}}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {0.5, 1.0});
  opt.step();  // buf = g = (0.5, 1);  p = (1 - 0.05, -2 - 0.1)
  EXPECT_FLOAT_EQ(p.to_vector()[0], 0.95f);
  EXPECT_FLOAT_EQ(p.to_vector()[1], -2.1f);
  opt.step();  // buf = 0.9 * buf + g = (0.95, 1.9);  p = (0.95 - 0.095, -2.1 - 0.19)
  EXPECT_FLOAT_EQ(p.to_vector()[0], 0.855f);
  EXPECT_FLOAT_EQ(p.to_vector()[1], -2.29f);
  EXPECT_FLOAT_EQ(opt.momentum_buffer().to_vector()[1], 1.9f);
}

TEST(SGD, WeightDecayIsAddedToTheGradient) {
  Tensor p = param({1.0, 2.0}, {1, 2});
  optim::SGD opt({{{p}, 0.1}}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {0.0, 1.0});
  opt.step();  // d = g + 0.1 p = (0.1, 1.2);  p -= 0.1 d
  EXPECT_FLOAT_EQ(p.to_vector()[0], 0.99f);
  EXPECT_FLOAT_EQ(p.to_vector()[1], 1.88f);
}

TEST(SGD, NoMomentumNeedsNoBuffer) {
  Tensor p = param({1.0}, {1});
  optim::SGD opt({{{p}, 0.0}}, {.lr = 0.5});
  EXPECT_FALSE(opt.momentum_buffer().defined());
  set_grad(p, {2.0});
  opt.step();
  opt.step();
  EXPECT_FLOAT_EQ(p.to_vector()[0], -1.0f);
}

TEST(Optimizer, ZeroGradZeroesInPlace) {
  Tensor a = param({1.0, 2.0}, {2}), b = param({3.0}, {1}), c = param({4.0}, {1});
  set_grad(a, {5.0, 6.0});
  set_grad(b, {7.0});
  void* storage = a.grad().raw_data();
  optim::SGD opt({{{a, b}, 0.0}, {{c}, 0.0}}, {});
  opt.zero_grad();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{0.0}));
  EXPECT_EQ(a.grad().raw_data(), storage);  // same buffer: nothing was freed or reallocated
  EXPECT_FALSE(c.grad().defined());         // a missing gradient stays missing
  // Gradients large enough to be split over threads, next to small ones (one parallel pass for all).
  Tensor big = Tensor::ones({300000}).set_requires_grad(true), small = Tensor::ones({3}).set_requires_grad(true);
  big.set_grad(Tensor::full({300000}, 2.5));
  small.set_grad(Tensor::full({3}, -1.0));
  optim::SGD many({{{big, small}, 0.0}}, {});
  many.zero_grad();
  EXPECT_EQ(big.grad().to_vector(), std::vector<double>(300000, 0.0));
  EXPECT_EQ(small.grad().to_vector(), std::vector<double>(3, 0.0));
}

TEST(Optimizer, LearningRateAndValidation) {
  Tensor a = param({1.0}, {1});
  optim::SGD opt({{{a}, 0.0}}, {.lr = 0.1});
  opt.set_lr(0.25);
  EXPECT_EQ(opt.lr(), 0.25);
  EXPECT_THROW(opt.set_lr(-1.0), Error);
  EXPECT_THROW(optim::SGD({{{a}, 0.0}, {{a}, 0.0}}, {}), Error);  // the same tensor twice
  EXPECT_THROW(optim::SGD({{{}, 0.0}}, {}), Error);               // nothing to optimize
  EXPECT_THROW(optim::SGD({{{a}, -0.1}}, {}), Error);
  EXPECT_THROW(optim::SGD({{{param({1.0}, {1}).detach()}, 0.0}}, {}), Error);  // does not require grad
}

TEST(DecayGroups, SplitsByDimension) {
  Tensor wte = param(std::vector<double>(6, 0.0), {3, 2}), fc = param(std::vector<double>(4, 0.0), {2, 2});
  Tensor bias = param({0.0, 0.0}, {2}), ln = param({1.0, 1.0}, {2});
  auto groups = optim::decay_groups({{"wte", wte}, {"ln.weight", ln}, {"fc.weight", fc}, {"fc.bias", bias}}, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  ASSERT_EQ(groups[0].params.size(), 2u);
  ASSERT_EQ(groups[1].params.size(), 2u);
  EXPECT_TRUE(groups[0].params[0].same(wte));
  EXPECT_TRUE(groups[0].params[1].same(fc));
  EXPECT_TRUE(groups[1].params[0].same(ln));
  EXPECT_TRUE(groups[1].params[1].same(bias));
}
