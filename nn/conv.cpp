#include "nn/conv.h"

#include "autograd/functions.h"

namespace minidl::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, bool bias,
               Device device)
    : stride(stride), padding(padding) {
  MINIDL_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0,
               "Conv2d: expected positive sizes, got in=", in_channels, " out=", out_channels, " kernel=", kernel);
  MINIDL_CHECK(stride >= 1 && padding >= 0, "Conv2d: expected stride >= 1 and padding >= 0, got stride=", stride,
               " padding=", padding);
  MemoryTagGuard tag(MemTag::kParams);
  weight = register_parameter("weight", Tensor::zeros({out_channels, kernel, kernel, in_channels}, DType::f32, device));
  if (bias) this->bias = register_parameter("bias", Tensor::zeros({out_channels}, DType::f32, device));
}

Tensor Conv2d::forward(const Tensor& x) const { return conv2d(x, weight, bias, stride, padding); }

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride) : kernel(kernel), stride(stride == 0 ? kernel : stride) {
  MINIDL_CHECK(kernel >= 1 && stride >= 0,
               "MaxPool2d: expected kernel >= 1 and stride >= 0 (0: the kernel), got "
               "kernel=",
               kernel, " stride=", stride);
}

Tensor MaxPool2d::forward(const Tensor& x) const { return max_pool2d(x, kernel, stride); }

}  // namespace minidl::nn
