// The model and data the library examples share: a 2-layer MLP learning a fixed random "teacher" function.
//
// The MLP is an nn::BlockModule (nn/block_hooks.h) with each layer a block, so ZeRO-3 can shard it (mlp_zero.cpp);
// one process and DDP use it as any module. Its layers start from PyTorch's default initialisation
// (nn::manual_seed makes it the same on every rank), and the data is a pure function of the seed: every program
// and every rank sees the same numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "nn/block_hooks.h"
#include "nn/layers.h"

namespace mlp_example {

using minidl::Philox;
using minidl::Tensor;

struct Mlp : minidl::nn::BlockModule {
  std::shared_ptr<minidl::nn::Linear> fc1, fc2;

  Mlp(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", std::make_shared<minidl::nn::Linear>(in, hidden));
    fc2 = register_module("fc2", std::make_shared<minidl::nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) const {
    Tensor h = run_block(0, x, [&](const Tensor& in) { return minidl::gelu(fc1->forward(in)); });
    return run_block(1, h, [&](const Tensor& in) { return fc2->forward(in); });
  }
  // BlockModule: block 0 is fc1, block 1 is fc2.
  int64_t num_blocks() const override { return 2; }
  std::vector<Tensor> block_parameters(int64_t i) const override { return (i == 0 ? fc1 : fc2)->parameters(); }
};

// n samples of 16 features and their targets tanh(x · w) for a fixed w: the task every example learns.
struct Data {
  Tensor x, y;
};
inline Data make_data(int64_t n) {
  Tensor x = Tensor::randn({n, 16}, Philox(/*seed=*/1));
  Tensor w = Tensor::randn({16, 1}, Philox(/*seed=*/2));
  return {x, minidl::tanh(minidl::matmul(x, w)).detach()};
}

// Mean squared error.
inline Tensor mse(const Tensor& prediction, const Tensor& target) {
  return minidl::mean(minidl::square(prediction - target));
}

}  // namespace mlp_example
