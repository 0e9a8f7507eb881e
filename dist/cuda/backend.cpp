#include "dist/cuda/backend.h"

#include "core/cuda/cuda.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::cuda {

void register_backend() {
  install_backend();
  ops::cuda::register_kernels();
  register_dist();
}

namespace {
// At static initialisation too, like core's backend and the ops' kernels: the backend library is linked whole
// (core/cuda/CMakeLists.txt), so a program that links it has the "nccl" process group without calling anything.
[[maybe_unused]] const bool registered = (register_dist(), true);
}  // namespace

}  // namespace minidl::cuda
