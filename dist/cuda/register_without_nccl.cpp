// minidl::cuda::register_dist() of a CUDA build that found no NCCL (cmake/FindNCCL.cmake): dist has nothing to
// register, so make_process_group("nccl") and the ring on a device say that this build has no NCCL backend.
#include "dist/cuda/backend.h"

namespace minidl::cuda {

void register_dist() {}

}  // namespace minidl::cuda
