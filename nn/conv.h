// Convolution and pooling layers on channels-last images (N, H, W, C): thin Modules over conv2d and max_pool2d
// of autograd/functions.h (layouts in ops/conv.h).
//
//   auto conv = std::make_shared<Conv2d>(1, 16, 3, /*stride=*/1, /*padding=*/1);  // weight (16, 3, 3, 1)
//   init_normal(conv->weight, std::sqrt(2.0 / conv->fan_in()), seed, /*stream=*/0);
//   Tensor y = MaxPool2d(2).forward(conv->forward(x));                             // (N, 28, 28, 1) -> (N, 14, 14, 16)
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace minidl::nn {

// y = conv2d(x, weight) + bias, zero padding. Parameters are allocated on `device` (zeros until initialised).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true, Device device = Device::cpu());
  // x: (N, H, W, in) -> (N, P, Q, out)
  Tensor forward(const Tensor& x) const;
  // Inputs each output sums over: kernel * kernel * in_channels (for initialisation scales).
  int64_t fan_in() const { return weight.numel() / weight.size(0); }

  Tensor weight;  // (out, kernel, kernel, in)
  Tensor bias;    // (out); undefined when constructed without bias
  int64_t stride, padding;
};

// Max over kernel x kernel windows, `stride` apart (default: kernel, non-overlapping). No parameters.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0);
  // x: (N, H, W, C) -> (N, (H - kernel) / stride + 1, (W - kernel) / stride + 1, C)
  Tensor forward(const Tensor& x) const;

  int64_t kernel, stride;
};

}  // namespace minidl::nn
