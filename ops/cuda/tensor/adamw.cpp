// ops/adamw.h on CUDA devices: ops/cuda/adamw.cu through ops/cuda/adamw.h, one tensor or a list in few launches.
#include <vector>

#include "ops/adamw.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/tensor/register.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops::cuda {
namespace {

void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& h) {
  OnDevice on(param);
  AdamWTensor t{param.device_data<float>(), grad.device_data<float>(), m.device_data<float>(), v.device_data<float>(),
                param.numel()};
  MINIDL_CUDA_CHECK(
      fused_adamw(&t, 1, kernels::adamw_constants(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step), on.stream));
}

void adamw_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                 const std::vector<Tensor>& v, const AdamWHyper& h) {
  OnDevice on(params.front());
  std::vector<AdamWTensor> list;
  for (size_t i = 0; i < params.size(); ++i)
    list.push_back({params[i].device_data<float>(), grads[i].device_data<float>(), m[i].device_data<float>(),
                    v[i].device_data<float>(), params[i].numel()});
  MINIDL_CUDA_CHECK(fused_adamw(list.data(), int(list.size()),
                                kernels::adamw_constants(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step),
                                on.stream));
}

void register_adamw() {
  fused_adamw_device.set(DeviceKind::kCUDA, &adamw);
  fused_adamw_multi_device.set(DeviceKind::kCUDA, &adamw_multi);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_adamw);

}  // namespace minidl::ops::cuda
