// ops/unscale.h on CUDA devices: ops/cuda/unscale.cu through ops/cuda/unscale.h.
#include <vector>

#include "ops/cuda/tensor/register.h"
#include "ops/cuda/unscale.h"
#include "ops/unscale.h"

namespace minidl::ops::cuda {
namespace {

// The overflow flag lives on the device; reading it back is the one synchronisation of the call.
bool unscale(const Tensor& grad, float inv_scale) {
  OnDevice on(grad);
  Tensor flag = Tensor::zeros({1}, DType::i32, grad.device());
  MINIDL_CUDA_CHECK(
      unscale_and_check(grad.device_data<float>(), grad.numel(), inv_scale, flag.device_data<int>(), on.stream));
  return flag.item() != 0;
}

bool unscale_multi(const std::vector<Tensor>& grads, float inv_scale) {
  OnDevice on(grads.front());
  Tensor flag = Tensor::zeros({1}, DType::i32, grads.front().device());
  for (const Tensor& g : grads)
    MINIDL_CUDA_CHECK(
        unscale_and_check(g.device_data<float>(), g.numel(), inv_scale, flag.device_data<int>(), on.stream));
  return flag.item() != 0;
}

void register_unscale() {
  unscale_and_check_device.set(DeviceKind::kCUDA, &unscale);
  unscale_and_check_multi_device.set(DeviceKind::kCUDA, &unscale_multi);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_unscale);

}  // namespace minidl::ops::cuda
