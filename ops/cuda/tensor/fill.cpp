// Tensor::fill_ on CUDA devices: core's DeviceBackend memsets values of one repeated byte and hands the others to
// ops/cuda/fill.cu (core/cuda/cuda.h: set_fill_kernel), since core has no kernels of its own.
#include "ops/cuda/fill.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

void register_fill() { minidl::cuda::set_fill_kernel(&fill_bytes); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_fill);

}  // namespace minidl::ops::cuda
