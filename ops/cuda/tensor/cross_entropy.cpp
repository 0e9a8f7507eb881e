// ops/cross_entropy.h on CUDA devices: ops/cuda/cross_entropy.cu through ops/cuda/cross_entropy.h, f32, f16 or bf16
// logits read as they are (no cast around the classifier), an f32 lse and loss.
#include "ops/cross_entropy.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/tensor/register.h"
#include "ops/embedding.h"  // indices_checked_on_host

namespace minidl::ops::cuda {
namespace {

// A small device tensor holding a host value.
Tensor device_i64(int64_t value, Device device) { return Tensor::full({1}, double(value), DType::i64, device); }

void check_logits(const char* op, const Tensor& logits) {
  MINIDL_CHECK(logits.dtype() == DType::f32 || is_half(logits.dtype()), op,
               ": expected f32, f16 or bf16 logits on a CUDA device, got ", logits.dtype());
}

// Calls f with the logits' element type (float, __half or __nv_bfloat16).
template <class F>
auto dispatch_logits(DType dtype, F&& f) {
  if (dtype == DType::f16) return f(__half{});
  if (dtype == DType::bf16) return f(__nv_bfloat16{});
  return f(float{});
}

// The targets are checked on a host copy (which also gives the count the mean divides by): one small transfer
// that synchronises, as reading the loss does anyway.
CrossEntropyForward cross_entropy_fwd(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                      Reduction reduction, int64_t classes) {
  check_logits("cross_entropy", logits);
  const int64_t N = logits.size(0), Vp = logits.size(1);
  // Targets the caller checked on the host before upload (HostCheckedIndicesGuard) need no copy for a sum: its
  // backward divides by 1, not by the count.
  const bool checked = indices_checked_on_host() && targets.dtype() == DType::i64 && reduction == Reduction::kSum;
  Tensor host_targets = checked ? Tensor() : host_i64(targets);
  CrossEntropyForward f{Tensor::empty({}, DType::f32, logits.device()), Tensor::empty({N}, DType::f32, logits.device()),
                        checked ? 0 : cross_entropy_count_targets(host_targets, classes, ignore_index)};
  Tensor ids = targets.dtype() == DType::i64 ? targets : host_targets.to(logits.device());
  OnDevice on(logits);
  Tensor row_loss = Tensor::empty({N}, DType::f32, logits.device());
  Tensor count = Tensor::empty({1}, DType::i64, logits.device());
  dispatch_logits(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(cross_entropy_forward(static_cast<const T*>(logits.raw_device_data()), ids.device_data<int64_t>(),
                                            f.lse.device_data<float>(), row_loss.device_data<float>(),
                                            f.loss.device_data<float>(), count.device_data<int64_t>(), N, classes, Vp,
                                            ignore_index, reduction == Reduction::kMean, on.stream));
  });
  return f;
}

Tensor cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                         int64_t divisor, int64_t ignore_index, int64_t classes, bool overwrite_logits) {
  check_logits("cross_entropy_backward", logits);
  check_f32("cross_entropy_backward", "lse", lse);
  const int64_t N = logits.size(0), Vp = logits.size(1);
  Tensor ids = targets.dtype() == DType::i64 ? targets : host_i64(targets).to(logits.device());
  Tensor d = dloss.to(logits.device());
  if (d.dtype() != DType::f32) d = cast(d, DType::f32);
  Tensor div = device_i64(divisor, logits.device());
  OnDevice on(logits);
  Tensor dlogits = overwrite_logits ? logits : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  dispatch_logits(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MINIDL_CUDA_CHECK(cross_entropy_backward(d.device_data<float>(), static_cast<const T*>(logits.raw_device_data()),
                                             ids.device_data<int64_t>(), lse.device_data<float>(),
                                             div.device_data<int64_t>(), static_cast<T*>(dlogits.raw_device_data()), N,
                                             classes, Vp, ignore_index, on.stream));
  });
  return dlogits;
}

void register_cross_entropy() {
  cross_entropy_forward_device.set(DeviceKind::kCUDA, &cross_entropy_fwd);
  cross_entropy_backward_device.set(DeviceKind::kCUDA, &cross_entropy_bwd);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_cross_entropy);

}  // namespace minidl::ops::cuda
