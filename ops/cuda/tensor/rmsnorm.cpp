// rmsnorm on CUDA devices: ops/cuda/rmsnorm.cu through ops/cuda/rmsnorm.h. x in f32, f16 or bf16 storage, read and
// written directly (no f32 copies): y and dx in x's dtype; weight, rstd and dweight f32. f64 stays a CPU dtype
// (gradient checks).
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/tensor/dispatch_storage.h"
#include "ops/cuda/tensor/register.h"
#include "ops/rmsnorm.h"

namespace minidl::ops::cuda {
namespace {

RMSNormForward forward(const Tensor& x, const Tensor& weight, double eps) {
  check_f32("rmsnorm", "weight", weight);
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = x.numel() / C;
  RMSNormForward f{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, DType::f32, x.device())};
  dispatch_float_storage("rmsnorm", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(rmsnorm_forward(storage_ptr<const T>(x), weight.device_data<float>(), storage_ptr<T>(f.y),
                                      f.rstd.device_data<float>(), rows, int(C), float(eps), on.stream));
  });
  return f;
}

RMSNormBackward backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  check_f32("rmsnorm_backward", "weight", weight);
  OnDevice on(x);
  const int64_t C = x.size(-1), rows = x.numel() / C;
  RMSNormBackward g{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, DType::f32, x.device())};
  Tensor scratch = Tensor::empty({int64_t(rmsnorm_backward_scratch_floats(rows, int(C)))}, DType::f32, x.device());
  dispatch_float_storage("rmsnorm_backward", x, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(rmsnorm_backward(storage_ptr<const T>(dy), storage_ptr<const T>(x), weight.device_data<float>(),
                                       rstd.device_data<float>(), storage_ptr<T>(g.dx), g.dweight.device_data<float>(),
                                       scratch.device_data<float>(), rows, int(C), on.stream));
  });
  return g;
}

void register_rmsnorm() {
  rmsnorm_forward_device.set(DeviceKind::kCUDA, &forward);
  rmsnorm_backward_device.set(DeviceKind::kCUDA, &backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_rmsnorm);

}  // namespace minidl::ops::cuda
