#include "dist/cuda/backend.h"

#include "core/cuda/cuda.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::cuda {

void register_backend() {
  install_backend();
  ops::cuda::register_kernels();
  register_dist();
}

}  // namespace minidl::cuda
