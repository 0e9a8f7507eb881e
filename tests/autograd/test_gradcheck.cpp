// Float64 central-difference checks of every differentiable op in autograd/functions/{elementwise,reduce,matmul}.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "core/parallel.h"
#include "tests/support/gradcheck.h"

namespace minidl {
namespace {

using testing::expect_gradients_match;
using testing::randn64;
using Inputs = std::vector<Tensor>;

Tensor param(const Shape& s, uint64_t seed) { return randn64(s, seed).set_requires_grad(true); }
// Entries in [0.5, 1.5) (log, sqrt, and a divisor away from zero).
Tensor positive(const Shape& s, uint64_t seed) {
  std::vector<double> v = randn64(s, seed).to_vector();
  for (double& e : v) e = 0.5 + std::abs(std::fmod(e, 1.0));
  return Tensor::from_vector(v, s, DType::f64).set_requires_grad(true);
}

TEST(Gradcheck, BinaryWithBroadcasting) {
  struct Pair {
    Shape a, b;
  };
  for (Pair p : {Pair{{2, 3, 4}, {2, 3, 4}}, Pair{{2, 3, 4}, {4}}, Pair{{2, 1, 4}, {3, 1}}, Pair{{3, 1}, {}}}) {
    SCOPED_TRACE(::testing::Message() << p.a << " op " << p.b);
    Tensor a = param(p.a, 1), b = param(p.b, 2), bp = positive(p.b, 3);
    expect_gradients_match([](const Inputs& in) { return add(in[0], in[1]); }, {a, b});
    expect_gradients_match([](const Inputs& in) { return sub(in[0], in[1]); }, {a, b});
    expect_gradients_match([](const Inputs& in) { return mul(in[0], in[1]); }, {a, b});
    expect_gradients_match([](const Inputs& in) { return div(in[0], in[1]); }, {a, bp});
    expect_gradients_match([](const Inputs& in) { return in[1] / in[0]; }, {bp, a});  // broadcast the numerator
  }
}

TEST(Gradcheck, OnlyOneSideRequiresGrad) {
  Tensor a = param({2, 3}, 4), c = randn64({3}, 5);  // c: a constant
  expect_gradients_match([c](const Inputs& in) { return mul(c, in[0]); }, {a});
  expect_gradients_match([c](const Inputs& in) { return sub(c, in[0]); }, {a});
  expect_gradients_match([c](const Inputs& in) { return div(in[0], add(square(c), 1.0)); }, {a});
}

TEST(Gradcheck, ScalarAndUnary) {
  Tensor x = param({3, 4}, 6), xp = positive({3, 4}, 7);
  expect_gradients_match([](const Inputs& in) { return in[0] + 1.5; }, {x});
  expect_gradients_match([](const Inputs& in) { return in[0] * -2.5; }, {x});
  expect_gradients_match([](const Inputs& in) { return -in[0]; }, {x});
  expect_gradients_match([](const Inputs& in) { return exp(in[0]); }, {x});
  expect_gradients_match([](const Inputs& in) { return log(in[0]); }, {xp});
  expect_gradients_match([](const Inputs& in) { return tanh(in[0]); }, {x});
  expect_gradients_match([](const Inputs& in) { return sqrt(in[0]); }, {xp});
  expect_gradients_match([](const Inputs& in) { return square(in[0]); }, {x});
}

TEST(Gradcheck, Reductions) {
  Tensor x = param({2, 3, 4}, 8);
  expect_gradients_match([](const Inputs& in) { return sum(in[0]); }, {x});
  expect_gradients_match([](const Inputs& in) { return mean(in[0]); }, {x});
  for (int d : {0, 1, 2, -1})
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << d << " keepdim " << keepdim);
      expect_gradients_match([d, keepdim](const Inputs& in) { return sum(in[0], d, keepdim); }, {x});
      expect_gradients_match([d, keepdim](const Inputs& in) { return mean(in[0], d, keepdim); }, {x});
      expect_gradients_match([d, keepdim](const Inputs& in) { return max(in[0], d, keepdim); }, {x});
    }
}

TEST(Gradcheck, MatmulAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      Shape sa = ta ? Shape{4, 3} : Shape{3, 4}, sb = tb ? Shape{5, 4} : Shape{4, 5};
      auto f = [ta, tb](const Inputs& in) { return matmul(in[0], in[1], ta, tb); };
      expect_gradients_match(f, {param(sa, 9), param(sb, 10)});
      // Batched x batched, batched x shared 2-D (dB summed over the batch), and 2-D x batched.
      expect_gradients_match(f, {param({2, sa[0], sa[1]}, 11), param({2, sb[0], sb[1]}, 12)});
      expect_gradients_match(f, {param({2, 2, sa[0], sa[1]}, 13), param(sb, 14)});
      expect_gradients_match(f, {param(sa, 15), param({2, sb[0], sb[1]}, 16)});
    }
}

TEST(Gradcheck, MatmulThreadedShapes) {
  set_num_threads(2);  // large enough for the row split and the folded batch
  auto f = [](const Inputs& in) { return matmul(in[0], in[1]); };
  expect_gradients_match(f, {param({2, 70, 16}, 17), param({16, 40}, 18)}, 1e-6, 1e-5);
}

TEST(Gradcheck, LinearWithAndWithoutBias) {
  Tensor w = param({4, 3}, 19), b = param({3}, 20);
  for (Shape xs : {Shape{4}, Shape{5, 4}, Shape{2, 3, 4}}) {
    SCOPED_TRACE(::testing::Message() << "x " << xs);
    Tensor x = param(xs, 21);
    expect_gradients_match([](const Inputs& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
    expect_gradients_match([](const Inputs& in) { return linear(in[0], in[1], Tensor()); }, {x, w});
  }
  // A strided x (a transposed view) takes the reshape-with-copy path.
  expect_gradients_match([](const Inputs& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
                         {param({4, 5}, 22), w, b});
}

}  // namespace
}  // namespace minidl
