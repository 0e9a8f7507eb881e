// The device half of a training step without host round trips, on CUDA devices: the global gradient norm and
// the clip (ops/grad_norm.h, launchers ops/cuda/grad_norm.h), unscaling by and updating a loss scale kept on the
// device (ops/unscale.h, ops/cuda/loss_scale.h), and AdamW skipping on the device's overflow flag (ops/adamw.h,
// ops/cuda/adamw_found_inf.h). Nothing here synchronises with the host or copies to it.
#include <vector>

#include "ops/adamw.h"
#include "ops/cuda/adamw_found_inf.h"
#include "ops/cuda/grad_norm.h"
#include "ops/cuda/loss_scale.h"
#include "ops/cuda/tensor/register.h"
#include "ops/grad_norm.h"
#include "ops/unscale.h"

namespace minidl::ops::cuda {
namespace {

std::vector<GradNormTensor> norm_list(const std::vector<Tensor>& grads) {
  std::vector<GradNormTensor> list;
  list.reserve(grads.size());
  for (const Tensor& g : grads) list.push_back({g.device_data<float>(), g.numel()});
  return list;
}

Tensor grad_norm_squared_on_device(const std::vector<Tensor>& grads, Device device) {
  Tensor out = Tensor::empty({1}, DType::f32, device);
  const std::vector<GradNormTensor> list = norm_list(grads);
  Tensor partials = Tensor::empty({grad_norm_partials(list.data(), int(list.size()))}, DType::f64, device);
  OnDevice on(out);
  MINIDL_CUDA_CHECK(grad_norm_squared(list.data(), int(list.size()), partials.device_data<double>(),
                                      out.device_data<float>(), on.stream));
  return out;
}

void clip_on_device(const std::vector<Tensor>& grads, const Tensor& norm_squared, double max_norm) {
  const std::vector<GradNormTensor> list = norm_list(grads);
  OnDevice on(norm_squared);
  MINIDL_CUDA_CHECK(clip_grads(list.data(), int(list.size()), norm_squared.device_data<float>(), max_norm, on.stream));
}

void unscale_by(const std::vector<Tensor>& grads, const Tensor& state, const Tensor& found_inf) {
  OnDevice on(state);
  for (const Tensor& g : grads)
    MINIDL_CUDA_CHECK(unscale_and_check_by(g.device_data<float>(), g.numel(), state.device_data<double>(),
                                           found_inf.device_data<int>(), on.stream));
}

void update_scale(const Tensor& state, const Tensor& scale_f32, const Tensor& found_inf, const ops::LossScaleRules& r) {
  OnDevice on(state);
  const LossScaleRules rules{r.growth_factor, r.backoff_factor,  r.min_scale,
                             r.max_scale,     r.growth_interval, r.hysteresis};
  MINIDL_CUDA_CHECK(update_loss_scale(state.device_data<double>(), scale_f32.device_data<float>(),
                                      found_inf.device_data<int>(), rules, on.stream));
}

void adamw_unless(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                  const std::vector<Tensor>& v, const AdamWHyper& h, const Tensor& found_inf, const Tensor& skipped,
                  bool count_skip) {
  OnDevice on(found_inf);
  std::vector<AdamWTensor> list;
  for (size_t i = 0; i < params.size(); ++i)
    list.push_back({params[i].device_data<float>(), grads[i].device_data<float>(), m[i].device_data<float>(),
                    v[i].device_data<float>(), params[i].numel()});
  AdamWDeviceStep step;
  step.lr = h.lr;
  step.beta1 = h.beta1;
  step.beta2 = h.beta2;
  step.eps = h.eps;
  step.weight_decay = h.weight_decay;
  step.step = h.step;
  step.found_inf = found_inf.device_data<int>();
  step.skipped = skipped.device_data<int64_t>();
  step.count_skip = count_skip;
  if (h.lr_on_device.defined()) step.lr_on_device = h.lr_on_device.device_data<double>();
  MINIDL_CUDA_CHECK(fused_adamw_unless_found_inf(list.data(), int(list.size()), step, on.stream));
}

void add_to_count_on_device(const Tensor& skipped, int64_t delta) {
  OnDevice on(skipped);
  MINIDL_CUDA_CHECK(add_to_count(skipped.device_data<int64_t>(), delta, on.stream));
}

void register_device_step() {
  add_to_count_device.set(DeviceKind::kCUDA, &add_to_count_on_device);
  grad_norm_squared_multi_device.set(DeviceKind::kCUDA, &grad_norm_squared_on_device);
  clip_grads_multi_device.set(DeviceKind::kCUDA, &clip_on_device);
  unscale_and_check_by_device.set(DeviceKind::kCUDA, &unscale_by);
  update_loss_scale_device.set(DeviceKind::kCUDA, &update_scale);
  fused_adamw_multi_unless_device.set(DeviceKind::kCUDA, &adamw_unless);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_device_step);

}  // namespace minidl::ops::cuda
