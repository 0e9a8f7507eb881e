// ops/sample_windows.h on CUDA devices: ops/cuda/sample_windows.cu through ops/cuda/sample_windows.h. The step
// tensor, when given, is read by the kernel, never copied to the host.
#include "ops/cuda/sample_windows.h"
#include "ops/cuda/tensor/register.h"
#include "ops/sample_windows.h"

namespace minidl::ops::cuda {
namespace {

void sample_windows_on_device(const Tensor& tokens, int64_t seq, const WindowDraw& d, const Tensor& x,
                              const Tensor& y) {
  OnDevice on(tokens);
  const int64_t* step = d.step_on_device.defined() ? d.step_on_device.device_data<int64_t>() : nullptr;
  MINIDL_CUDA_CHECK(sample_windows(tokens.device_data<int32_t>(), tokens.numel(), seq, d.seed, d.stream, d.global_batch,
                                   d.step, step, d.begin, x.size(0), x.device_data<int64_t>(), y.device_data<int64_t>(),
                                   on.stream));
}

void register_sample_windows() { sample_windows_device.set(DeviceKind::kCUDA, &sample_windows_on_device); }

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_sample_windows);

}  // namespace minidl::ops::cuda
