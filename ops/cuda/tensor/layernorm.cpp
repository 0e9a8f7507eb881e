// layernorm on CUDA devices: ops/cuda/layernorm.cu through ops/cuda/layernorm.h. x in f32, f16 or bf16 storage,
// read and written directly (no f32 copies): y and dx in x's dtype; weight, bias, mean, rstd, dweight and dbias f32.
// f64 stays a CPU dtype (gradient checks). add_layernorm (the residual add fused in) runs the same kernels.
#include "ops/cuda/layernorm.h"
#include "ops/cuda/tensor/dispatch_storage.h"
#include "ops/cuda/tensor/register.h"
#include "ops/layernorm.h"

namespace minidl::ops::cuda {
namespace {

LayerNormForward forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_f32("layernorm", "weight", weight);
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = x.numel() / C;
  LayerNormForward f{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, DType::f32, x.device()),
                     Tensor::empty({rows}, DType::f32, x.device())};
  dispatch_float_storage("layernorm", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(layernorm_forward(storage_ptr<const T>(x), weight.device_data<float>(), bias.device_data<float>(),
                                        storage_ptr<T>(f.y), f.mean.device_data<float>(), f.rstd.device_data<float>(),
                                        rows, int(C), float(eps), on.stream));
  });
  return f;
}

LayerNormBackward backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd) {
  check_f32("layernorm_backward", "weight", weight);
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = x.numel() / C;
  LayerNormBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, DType::f32, x.device()),
                      Tensor::empty({C}, DType::f32, x.device())};
  Tensor scratch = Tensor::empty({int64_t(layernorm_backward_scratch_floats(rows, int(C)))}, DType::f32, x.device());
  dispatch_float_storage("layernorm_backward", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(layernorm_backward(storage_ptr<const T>(dy), storage_ptr<const T>(x), weight.device_data<float>(),
                                         mean.device_data<float>(), rstd.device_data<float>(), storage_ptr<T>(g.dx),
                                         g.dweight.device_data<float>(), g.dbias.device_data<float>(),
                                         scratch.device_data<float>(), rows, int(C), on.stream));
  });
  return g;
}

AddLayerNormForward add_forward(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                double eps) {
  check_f32("add_layernorm", "weight", weight);
  OnDevice on(a);
  const int64_t C = a.size(-1), rows = a.numel() / C;
  AddLayerNormForward f{Tensor::empty(a.shape(), a.dtype(), a.device()),
                        Tensor::empty(a.shape(), a.dtype(), a.device()), Tensor::empty({rows}, DType::f32, a.device()),
                        Tensor::empty({rows}, DType::f32, a.device())};
  dispatch_float_storage("add_layernorm", a, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(add_layernorm_forward(storage_ptr<const T>(a), storage_ptr<const T>(b),
                                            weight.device_data<float>(), bias.device_data<float>(),
                                            storage_ptr<T>(f.sum), storage_ptr<T>(f.y), f.mean.device_data<float>(),
                                            f.rstd.device_data<float>(), rows, int(C), float(eps), on.stream));
  });
  return f;
}

LayerNormBackward add_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd) {
  check_f32("add_layernorm_backward", "weight", weight);
  OnDevice on(sum);
  const int64_t C = sum.size(-1), rows = sum.numel() / C;
  LayerNormBackward g{Tensor::empty(sum.shape(), sum.dtype(), sum.device()),
                      Tensor::empty({C}, DType::f32, sum.device()), Tensor::empty({C}, DType::f32, sum.device())};
  Tensor scratch = Tensor::empty({int64_t(layernorm_backward_scratch_floats(rows, int(C)))}, DType::f32, sum.device());
  dispatch_float_storage("add_layernorm_backward", sum, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(add_layernorm_backward(
        storage_ptr<const T>(dy), storage_ptr<const T>(sum), weight.device_data<float>(), mean.device_data<float>(),
        rstd.device_data<float>(), dsum.defined() ? storage_ptr<const T>(dsum) : nullptr, storage_ptr<T>(g.dx),
        g.dweight.device_data<float>(), g.dbias.device_data<float>(), scratch.device_data<float>(), rows, int(C),
        on.stream));
  });
  return g;
}

void register_layernorm() {
  add_layernorm_forward_device.set(DeviceKind::kCUDA, &add_forward);
  add_layernorm_backward_device.set(DeviceKind::kCUDA, &add_backward);
  layernorm_forward_device.set(DeviceKind::kCUDA, &forward);
  layernorm_backward_device.set(DeviceKind::kCUDA, &backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_layernorm);

}  // namespace minidl::ops::cuda
