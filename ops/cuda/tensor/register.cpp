#include "ops/cuda/tensor/register.h"

namespace minidl::cuda {

void register_ops() {
  ops::cuda::register_layernorm();
  ops::cuda::register_conv();
}

}  // namespace minidl::cuda
