#include "ops/cuda/tensor/register.h"

namespace minidl::cuda {

void register_ops() {
  ops::cuda::register_layernorm();
  ops::cuda::register_nn();
  ops::cuda::register_matmul();
  ops::cuda::register_elementwise();
  ops::cuda::register_reduce();
  ops::cuda::register_softmax();
  ops::cuda::register_gelu();
  ops::cuda::register_conv();
  ops::cuda::register_device_step();
}

}  // namespace minidl::cuda
