// The real CUDA backend built without cuDNN (cmake/FindCUDNN.cmake found none): conv2d and max_pool2d register no
// CUDA kernel, so on a CUDA tensor they fail naming the op and the device ("conv2d: no kernel for cuda:0 in this
// build ..."). Install cuDNN and reconfigure to get conv_cudnn.cpp instead.
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {

void register_conv() {}

}  // namespace minidl::ops::cuda
