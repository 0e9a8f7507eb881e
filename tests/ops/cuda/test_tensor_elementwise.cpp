// ops/elementwise.h, ops/gelu.h and ops/softmax.h on device tensors (ops/cuda/elementwise.cu, bias_gelu.cu,
// softmax.cu through ops/cuda/tensor/), against the same ops on the CPU: broadcasting (rows, columns, scalars,
// leading dimensions), strided views, ragged sizes and partial warps, empty tensors, 16-bit storage, in-place
// accumulation, sum_to_shape's one- and multi-pass reductions, and the errors for what the kernels do not take.
#include <cmath>

#include "ops/elementwise.h"
#include "ops/gelu.h"
#include "ops/softmax.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

struct ShapePair {
  Shape a, b;
};

const ShapePair kBroadcasts[] = {
    {{3, 5, 7}, {3, 5, 7}},  // same shape, not a multiple of 4: the vector path's tail
    {{8, 16}, {8, 16}},      // same shape, vectorised
    {{3, 5, 7}, {7}},        // a row (bias)
    {{3, 5, 7}, {5, 1}},     // a column
    {{3, 5, 7}, {}},         // a scalar-shaped tensor
    {{}, {3, 5, 7}},         // ... on the left
    {{1, 33}, {65, 1}},      // both stretched: an outer product
    {{2, 1, 4, 1}, {3, 1, 5}},
    {{257}, {257}},
    {{0, 5}, {5}},  // empty
    {{4, 0}, {1}},
};

// A positive divisor, away from zero.
Tensor divisor(const Shape& shape, uint64_t seed) {
  return ops::add(ops::square(random_tensor(shape, seed, DType::f32)), 0.5);
}

TEST_F(CudaTensorOps, BinaryOpsBroadcastLikeTheCpu) {
  for (const auto& [sa, sb] : kBroadcasts) {
    const std::string what = shape_name(sa) + " with " + shape_name(sb);
    const Tensor a = random_tensor(sa, 1, DType::f32), b = random_tensor(sb, 2, DType::f32);
    const Tensor da = a.to(kCuda), db = b.to(kCuda);
    expect_device_matches(ops::add(da, db), ops::add(a, b), 1e-6, "add " + what);
    expect_device_matches(ops::sub(da, db), ops::sub(a, b), 1e-6, "sub " + what);
    expect_device_matches(ops::mul(da, db), ops::mul(a, b), 1e-6, "mul " + what);
    const Tensor d = divisor(sb, 3);
    expect_device_matches(ops::div(da, d.to(kCuda)), ops::div(a, d), 1e-6, "div " + what);
  }
}

TEST_F(CudaTensorOps, BinaryOpsReadStridedViews) {
  const Tensor a = random_tensor({6, 9}, 4, DType::f32), b = random_tensor({9, 6}, 5, DType::f32);
  const Tensor da = a.to(kCuda), db = b.to(kCuda);
  // Transposed (no contiguous dimension), and a narrowed window (rows of 5 with a row stride of 9).
  expect_device_matches(ops::add(da, db.transpose(0, 1)), ops::add(a, b.transpose(0, 1)), 1e-6, "transposed");
  expect_device_matches(ops::mul(da.narrow(1, 2, 5), db.transpose(0, 1).narrow(1, 1, 5)),
                        ops::mul(a.narrow(1, 2, 5), b.transpose(0, 1).narrow(1, 1, 5)), 1e-6, "narrowed");
  expect_device_matches(ops::sub(da.narrow(0, 1, 4), da.narrow(0, 1, 1)),
                        ops::sub(a.narrow(0, 1, 4), a.narrow(0, 1, 1)), 1e-6, "narrowed broadcast");
  // Contiguous but not 16-byte aligned: the flat path without vectors.
  const Tensor v = random_tensor({257}, 6, DType::f32), w = random_tensor({257}, 7, DType::f32);
  expect_device_matches(ops::add(v.to(kCuda).narrow(0, 1, 200), w.to(kCuda).narrow(0, 3, 200)),
                        ops::add(v.narrow(0, 1, 200), w.narrow(0, 3, 200)), 1e-6, "misaligned");
  expect_device_matches(ops::exp(v.to(kCuda).narrow(0, 2, 255)), ops::exp(v.narrow(0, 2, 255)), 1e-6, "misaligned exp");
}

TEST_F(CudaTensorOps, UnaryAndScalarOpsMatchTheCpu) {
  const Shape shapes[] = {{3, 5, 7}, {257}, {1, 33}, {8, 16}, {}, {0}, {2, 0, 3}};
  for (const Shape& shape : shapes) {
    const std::string what = shape_name(shape);
    const Tensor x = random_tensor(shape, 6, DType::f32, 2.0), pos = divisor(shape, 7);
    const Tensor dx = x.to(kCuda), dpos = pos.to(kCuda);
    expect_device_matches(ops::neg(dx), ops::neg(x), 0, "neg " + what);
    expect_device_matches(ops::exp(dx), ops::exp(x), 1e-6, "exp " + what);
    expect_device_matches(ops::log(dpos), ops::log(pos), 1e-6, "log " + what);
    expect_device_matches(ops::tanh(dx), ops::tanh(x), 1e-6, "tanh " + what);
    expect_device_matches(ops::sqrt(dpos), ops::sqrt(pos), 1e-6, "sqrt " + what);
    expect_device_matches(ops::square(dx), ops::square(x), 1e-6, "square " + what);
    expect_device_matches(ops::add(dx, 0.25), ops::add(x, 0.25), 1e-6, "add scalar " + what);
    expect_device_matches(ops::mul(dx, -3.5), ops::mul(x, -3.5), 1e-6, "mul scalar " + what);
    const Tensor g = random_tensor(shape, 8, DType::f32), y = ops::tanh(x);
    expect_device_matches(ops::tanh_backward(g.to(kCuda), y.to(kCuda)), ops::tanh_backward(g, y), 1e-6,
                          "tanh_backward " + what);
  }
  const Tensor x = random_tensor({5, 6}, 9, DType::f32);
  expect_device_matches(ops::exp(x.to(kCuda).transpose(0, 1)), ops::exp(x.transpose(0, 1)), 1e-6, "exp of a view");
}

TEST_F(CudaTensorOps, SixteenBitStorageComputesInF32) {
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor a = random_tensor({3, 5, 7}, 10, dt), b = random_tensor({5, 1}, 11, dt);
    const Tensor da = a.to(kCuda), db = b.to(kCuda);
    const std::string name(dtype_name(dt));
    // The same f32 math and one rounding as the CPU: equal to within the 16-bit rounding.
    expect_device_matches(ops::add(da, db), ops::add(a, b), rtol_for(dt), "add " + name);
    expect_device_matches(ops::mul(da, db), ops::mul(a, b), rtol_for(dt), "mul " + name);
    expect_device_matches(ops::exp(da), ops::exp(a), rtol_for(dt), "exp " + name);
    expect_device_matches(ops::mul(da, 0.5), ops::mul(a, 0.5), rtol_for(dt), "mul scalar " + name);
    expect_device_matches(ops::gelu_forward(da), ops::gelu_forward(a), rtol_for(dt), "gelu " + name);
    const Tensor dy = random_tensor({3, 5, 7}, 12, dt);
    expect_device_matches(ops::gelu_backward(dy.to(kCuda), da), ops::gelu_backward(dy, a), rtol_for(dt),
                          "gelu_backward " + name);
    expect_device_matches(ops::sum_to_shape(da, {7}), ops::sum_to_shape(a, {7}), 2 * rtol_for(dt),
                          "sum_to_shape " + name);
    const Tensor bias = random_tensor({7}, 13, dt);
    expect_device_matches(ops::bias_gelu_forward(da, bias.to(kCuda)), ops::bias_gelu_forward(a, bias), rtol_for(dt),
                          "bias_gelu " + name);
    const ops::BiasGeluBackward got = ops::bias_gelu_backward(dy.to(kCuda), da, bias.to(kCuda));
    const ops::BiasGeluBackward want = ops::bias_gelu_backward(dy, a, bias);
    expect_device_matches(got.dx, want.dx, rtol_for(dt), "bias_gelu_backward dx " + name);
    expect_device_matches(got.dbias, want.dbias, 2 * rtol_for(dt), "bias_gelu_backward dbias " + name);
  }
}

TEST_F(CudaTensorOps, AddInPlaceAccumulates) {
  const Tensor acc = random_tensor({9, 37}, 14, DType::f32), g = random_tensor({37, 9}, 15, DType::f32);
  Tensor want = acc.clone();
  ops::add_(want, g.transpose(0, 1));
  ops::add_(want, g.transpose(0, 1));
  Tensor dacc = acc.to(kCuda);
  const Tensor dg = g.to(kCuda);
  ops::add_(dacc, dg.transpose(0, 1));
  ops::add_(dacc, dg.transpose(0, 1));
  expect_device_matches(dacc, want, 1e-6, "add_ twice, strided source");
  Tensor dsame = acc.to(kCuda);
  ops::add_(dsame, acc.to(kCuda));
  expect_device_matches(dsame, ops::mul(acc, 2.0), 1e-6, "add_ contiguous");
  // A 16-bit gradient into an f32 accumulator (mixed precision), converted on the device.
  const Tensor h = random_tensor({9, 37}, 28, DType::bf16);
  Tensor want_mixed = acc.clone();
  ops::add_(want_mixed, h);
  Tensor dmixed = acc.to(kCuda);
  ops::add_(dmixed, h.to(kCuda));
  expect_device_matches(dmixed, want_mixed, 1e-6, "add_ of a bf16 source");
  Tensor d16 = h.to(kCuda);
  expect_error([&] { ops::add_(d16, h.to(kCuda)); }, {"add_", "bf16", "cuda:0"});
}

TEST_F(CudaTensorOps, BroadcastToMaterialises) {
  const ShapePair cases[] = {{{5, 1}, {3, 5, 7}}, {{7}, {3, 5, 7}}, {{}, {4, 4}}, {{1, 33}, {2, 33}}, {{3}, {0, 3}}};
  for (const auto& [from, to] : cases) {
    const Tensor t = random_tensor(from, 16, DType::f32);
    expect_device_matches(ops::broadcast_to(t.to(kCuda), to), ops::broadcast_to(t, to), 0,
                          shape_name(from) + " to " + shape_name(to));
  }
}

TEST_F(CudaTensorOps, SumToShapeReducesBroadcastGradients) {
  const ShapePair cases[] = {
      {{3, 5, 7}, {7}},                           // bias: one pass over the leading dimensions
      {{3, 5, 7}, {5, 7}},                        // position embedding
      {{3, 5, 7}, {5, 1}},                        // summed, kept, summed: two passes
      {{3, 5, 7}, {3, 1, 7}},                     // a middle dimension
      {{3, 5, 7}, {1, 5, 1}}, {{3, 5, 7}, {}},    // everything
      {{3, 5, 7}, {1, 1, 1}}, {{300, 33}, {33}},  // rows in several chunks, added in a second pass
      {{1100, 4}, {1, 4}},    {{2, 40, 3}, {40, 1}}, {{1, 3, 5}, {3, 5}},  // only a size-1 dimension dropped: a copy
      {{0, 5}, {5}},                                                       // empty gradient: zeros
      {{4, 1}, {1, 1}},
  };
  for (const auto& [from, to] : cases) {
    const Tensor g = random_tensor(from, 17, DType::f32);
    expect_device_matches(ops::sum_to_shape(g.to(kCuda), to), ops::sum_to_shape(g, to), 1e-5,
                          shape_name(from) + " to " + shape_name(to));
  }
  // Of a strided gradient, and the same bits on a second run.
  const Tensor g = random_tensor({33, 300}, 18, DType::f32);
  const Tensor first = ops::sum_to_shape(g.to(kCuda).transpose(0, 1), {33});
  expect_device_matches(first, ops::sum_to_shape(g.transpose(0, 1), {33}), 1e-5, "transposed gradient");
  EXPECT_EQ(ops::sum_to_shape(g.to(kCuda).transpose(0, 1), {33}).to(Device::cpu()).to_vector(),
            first.to(Device::cpu()).to_vector());
}

TEST_F(CudaTensorOps, GeluMatchesTheCpu) {
  const Shape shapes[] = {{3, 5, 7}, {257}, {4, 64}, {0, 3}};
  for (const Shape& shape : shapes) {
    const Tensor x = random_tensor(shape, 19, DType::f32, 3.0), dy = random_tensor(shape, 20, DType::f32);
    expect_device_matches(ops::gelu_forward(x.to(kCuda)), ops::gelu_forward(x), 1e-5, "gelu " + shape_name(shape));
    expect_device_matches(ops::gelu_backward(dy.to(kCuda), x.to(kCuda)), ops::gelu_backward(dy, x), 1e-5,
                          "gelu_backward " + shape_name(shape));
    const int64_t C = shape[shape.size() - 1];
    const Tensor bias = random_tensor({C}, 21, DType::f32);
    expect_device_matches(ops::bias_gelu_forward(x.to(kCuda), bias.to(kCuda)), ops::bias_gelu_forward(x, bias), 1e-5,
                          "bias_gelu " + shape_name(shape));
    const ops::BiasGeluBackward got = ops::bias_gelu_backward(dy.to(kCuda), x.to(kCuda), bias.to(kCuda));
    const ops::BiasGeluBackward want = ops::bias_gelu_backward(dy, x, bias);
    expect_device_matches(got.dx, want.dx, 1e-5, "bias_gelu_backward dx " + shape_name(shape));
    expect_device_matches(got.dbias, want.dbias, 1e-5, "bias_gelu_backward dbias " + shape_name(shape));
  }
}

TEST_F(CudaTensorOps, SoftmaxMatchesTheCpu) {
  const Shape shapes[] = {{1, 1}, {3, 5, 7}, {4, 33}, {2, 257}, {9, 32}, {0, 5}};
  for (const Shape& shape : shapes) {
    for (double scale : {1.0, 50.0}) {  // large logits: the max subtraction keeps exp finite
      const std::string what = shape_name(shape) + " scale " + std::to_string(int(scale));
      const Tensor x = random_tensor(shape, 22, DType::f32, scale), dy = random_tensor(shape, 23, DType::f32);
      const Tensor y = ops::softmax_forward(x);
      const Tensor dy_dev = ops::softmax_forward(x.to(kCuda));
      expect_device_matches(dy_dev, y, 1e-5, "softmax " + what);
      expect_device_matches(ops::softmax_backward(dy.to(kCuda), y.to(kCuda)), ops::softmax_backward(dy, y), 1e-5,
                            "softmax_backward " + what);
    }
  }
  // A row with -inf logits (a mask): those get probability 0, like on the CPU.
  Values v = random_values(80, 24);
  for (int j = 20; j < 40; ++j) v[size_t(j)] = -INFINITY;
  const Tensor masked = Tensor::from_vector(v, {2, 40});
  expect_device_matches(ops::softmax_forward(masked.to(kCuda)), ops::softmax_forward(masked), 1e-5, "masked row");
}

TEST_F(CudaTensorOps, WhatTheKernelsDoNotTakeNamesOpDtypeAndDevice) {
  const Tensor d64 = random_tensor({4}, 25, DType::f64).to(kCuda);
  expect_error([&] { ops::add(d64, d64); }, {"add", "f64", "cuda:0"});
  expect_error([&] { ops::exp(d64); }, {"exp", "f64", "cuda:0"});
  expect_error([&] { ops::gelu_forward(d64); }, {"gelu", "f64", "cuda:0"});
  expect_error([&] { ops::softmax_forward(d64); }, {"softmax", "f64", "cuda:0"});
  const Tensor h = random_tensor({2, 4}, 26, DType::bf16).to(kCuda);
  expect_error([&] { ops::softmax_forward(h); }, {"softmax", "bf16"});  // the CPU op refuses it too
  const Tensor x = random_tensor({4}, 27, DType::f32);
  expect_error([&] { ops::add(x, x.to(kCuda)); }, {"add", "cpu", "cuda:0"});
  // An op whose table has no CUDA kernel (removed here) names the op and the device; register_kernels() restores.
  ops::exp_device.set(DeviceKind::kCUDA, nullptr);
  expect_error([&] { ops::exp(x.to(kCuda)); }, {"exp", "no kernel for cuda:0"});
  ops::cuda::register_kernels();
  expect_device_matches(ops::exp(x.to(kCuda)), ops::exp(x), 1e-6, "exp after register_kernels()");
}

}  // namespace
}  // namespace minidl::testing
