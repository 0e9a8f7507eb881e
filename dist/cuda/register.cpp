// minidl::cuda::register_dist(): plugs dist's CUDA code into the minidl library, which does not link it — the
// "nccl" process-group backend, the NCCL transport of the ring on CUDA devices, and the device kernels of
// dist/reduce.h.
#include "dist/cuda/backend.h"
#include "dist/cuda/nccl_backend.h"
#include "dist/cuda/tensor_kernels.h"

namespace minidl::cuda {

namespace {

std::unique_ptr<dist::ProcessGroup> make_nccl_group(MPI_Comm comm, std::optional<Device> device) {
  return std::make_unique<dist::NcclProcessGroup>(comm, device ? *device : dist::default_cuda_device(comm));
}

std::unique_ptr<dist::RingTransport> make_nccl_transport(MPI_Comm comm, Device device) {
  return std::make_unique<dist::NcclTransport>(comm, device);
}

}  // namespace

void register_dist() {
  dist::register_tensor_kernels();
  dist::register_process_group_factory("nccl", &make_nccl_group);
  dist::register_ring_transport_factory(DeviceKind::kCUDA, &make_nccl_transport);
}

}  // namespace minidl::cuda
