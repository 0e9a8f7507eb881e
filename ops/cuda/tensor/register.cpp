#include "ops/cuda/tensor/register.h"

namespace minidl::cuda {

void register_ops() {
  ops::cuda::register_layernorm();
}

}  // namespace minidl::cuda
