// The backward engine: accumulation, hooks, grad mode, freed graphs, and errors raised through the public API.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "tests/ops/reference.h"

namespace minidl {
namespace {

using testing::expect_error_mentions;

Tensor leaf(std::vector<double> v) {
  Shape s{int64_t(v.size())};
  return Tensor::from_vector(v, s, DType::f64).set_requires_grad(true);
}

TEST(Engine, DiamondAccumulatesBothPaths) {
  Tensor x = leaf({1, 2, 3});
  // y = x*x + x*3: x reaches the output through three edges; dy/dx = 2x + 3.
  Tensor y = sum(add(mul(x, x), mul(x, 3.0)));
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5, 7, 9}));
}

TEST(Engine, GradReadyHookFiresOncePerBackwardWithFinalGradient) {
  Tensor x = leaf({1, 2});
  int calls = 0;
  std::vector<double> seen;
  x.register_grad_ready_hook([&](Tensor& g) {
    ++calls;
    seen = g.to_vector();
  });
  auto run = [&] { sum(add(mul(x, x), exp(mul(x, 0.0)))).backward(); };  // d/dx = 2x (exp(0x) has gradient 0)
  run();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{2, 4}));
  run();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen, (std::vector<double>{4, 8}));  // accumulated over the two backwards
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = leaf({1, -1});
  Tensor x = Tensor::from_vector(std::vector<double>{3, 4}, {2}, DType::f64);
  sum(mul(w, x)).backward();
  sum(mul(w, x)).backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{6, 8}));
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2});
  Tensor y;
  {
    autograd::NoGradGuard guard;
    EXPECT_FALSE(autograd::grad_mode_enabled());
    y = matmul(x.reshape({1, 2}), x.reshape({2, 1}));
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), Error);
}

TEST(Engine, SecondBackwardThroughFreedGraphThrows) {
  Tensor x = leaf({1, 2});
  Tensor y = sum(tanh(x));
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(Engine, ConstantsGetNoGradient) {
  Tensor x = leaf({1, 2});
  Tensor c = Tensor::from_vector(std::vector<double>{5, 6}, {2}, DType::f64);
  sum(div(c, x)).backward();
  EXPECT_FALSE(c.grad().defined());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{-5, -1.5}));  // -c / x^2
}

TEST(Engine, BadInputsThroughThePublicApiNameShapes) {
  Tensor a = Tensor::zeros({2, 3}).set_requires_grad(true);
  expect_error_mentions([&] { add(a, Tensor::zeros({4})); }, {"add", "(2, 3)", "(4,)"});
  expect_error_mentions([&] { matmul(a, Tensor::zeros({2, 3})); }, {"matmul", "(2, 3)", "K=3", "K=2"});
  expect_error_mentions([&] { linear(a, Tensor::zeros({4, 3}), Tensor()); }, {"linear", "(2, 3)", "(4, 3)"});
  expect_error_mentions([] { sum(Tensor::zeros({2}, DType::i64)); }, {"sum", "i64"});
  expect_error_mentions([] { mul(Tensor::zeros({2}, DType::i32), 2.0); }, {"mul", "i32"});
}

// A root given twice counts twice, as in PyTorch: backward({l, l}) is backward of l + l.
TEST(Engine, RepeatedRootGradientsAddUp) {
  Tensor w = leaf({1, 2});
  Tensor l = sum(mul(w, w));  // dl/dw = 2w
  autograd::backward({l, l}, {});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{4, 8}));

  Tensor v = leaf({1, 2, 3});
  Tensor y = mul(v, 3.0);  // a non-scalar root with explicit gradients, twice
  autograd::backward({y, y}, {Tensor::from_vector(std::vector<double>{1, 0, 2}, {3}, DType::f64),
                              Tensor::from_vector(std::vector<double>{0, 1, 1}, {3}, DType::f64)});
  EXPECT_EQ(v.grad().to_vector(), (std::vector<double>{3, 3, 9}));
}

// A leaf as a repeated root: its grad is the sum of the root gradients and its hooks fire once.
TEST(Engine, RepeatedLeafRootGradientsAddUp) {
  Tensor w = leaf({1, 2});
  int calls = 0;
  w.register_grad_ready_hook([&](Tensor&) { ++calls; });
  autograd::backward({w, w}, {Tensor::from_vector(std::vector<double>{1, 10}, {2}, DType::f64),
                              Tensor::from_vector(std::vector<double>{2, 20}, {2}, DType::f64)});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{3, 30}));
  EXPECT_EQ(calls, 1);

  Tensor s = Tensor::from_vector(std::vector<double>{4}, {1}, DType::f64).set_requires_grad(true);
  autograd::backward({s}, {});  // a scalar leaf root alone: gradient one
  EXPECT_EQ(s.grad().to_vector(), (std::vector<double>{1}));
}

// A root that is also reached through another root's graph waits for that gradient too.
TEST(Engine, RootThatIsAlsoAnInnerNode) {
  Tensor w = leaf({1, 2});
  Tensor y = mul(w, w);
  Tensor l = sum(y);
  autograd::backward({l, y}, {Tensor(), Tensor::from_vector(std::vector<double>{1, 1}, {2}, DType::f64)});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{4, 8}));  // 2w from l, 2w from y
}

}  // namespace
}  // namespace minidl
