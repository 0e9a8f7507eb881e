// layernorm on CUDA devices: ops/cuda/layernorm.cu through ops/cuda/layernorm.h. f32 only (f64 stays a CPU dtype
// for gradient checks; 16-bit activations are normalised in f32 under autocast).
#include "ops/cuda/layernorm.h"
#include "ops/cuda/tensor/register.h"
#include "ops/layernorm.h"

namespace minidl::ops::cuda {
namespace {

LayerNormForward forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_f32("layernorm", "x", x);
  OnDevice on(x);
  int64_t C = x.size(-1), rows = x.numel() / C;
  LayerNormForward f{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, x.dtype(), x.device()),
                     Tensor::empty({rows}, x.dtype(), x.device())};
  MINIDL_CUDA_CHECK(layernorm_forward(x.device_data<float>(), weight.device_data<float>(), bias.device_data<float>(),
                                      f.y.device_data<float>(), f.mean.device_data<float>(),
                                      f.rstd.device_data<float>(), rows, int(C), float(eps), on.stream));
  return f;
}

LayerNormBackward backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd) {
  check_f32("layernorm_backward", "x", x);
  OnDevice on(x);
  int64_t C = x.size(-1), rows = x.numel() / C;
  LayerNormBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device()),
                      Tensor::empty({C}, x.dtype(), x.device())};
  Tensor scratch = Tensor::empty({int64_t(layernorm_backward_scratch_floats(rows, int(C)))}, DType::f32, x.device());
  MINIDL_CUDA_CHECK(layernorm_backward(dy.device_data<float>(), x.device_data<float>(), weight.device_data<float>(),
                                       mean.device_data<float>(), rstd.device_data<float>(),
                                       g.dx.device_data<float>(), g.dweight.device_data<float>(),
                                       g.dbias.device_data<float>(), scratch.device_data<float>(), rows, int(C),
                                       on.stream));
  return g;
}

void register_layernorm() {
  layernorm_forward_device.set(DeviceKind::kCUDA, &forward);
  layernorm_backward_device.set(DeviceKind::kCUDA, &backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_layernorm);

}  // namespace minidl::ops::cuda
