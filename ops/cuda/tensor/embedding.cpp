// ops/embedding.h on CUDA devices: ops/cuda/embedding.cu through ops/cuda/embedding.h, f32 weights.
#include "ops/cuda/embedding.h"
#include "ops/cuda/tensor/register.h"
#include "ops/embedding.h"

namespace minidl::ops::cuda {
namespace {

Tensor embedding_fwd(const Tensor& weight, const Tensor& ids) {
  check_f32("embedding", "weight", weight);
  int64_t V = weight.size(0), C = weight.size(1), n = ids.numel();
  Tensor dev_ids = ids;
  if (!indices_checked_on_host() || ids.dtype() != DType::i64) {  // otherwise checked before upload
    Tensor host_ids = host_i64(ids);
    embedding_check_ids(host_ids, V);
    if (ids.dtype() != DType::i64) dev_ids = host_ids.to(weight.device());
  }
  Shape shape = ids.shape();
  shape.push_back(C);
  OnDevice on(weight);
  Tensor out = Tensor::empty(shape, DType::f32, weight.device());
  MINIDL_CUDA_CHECK(embedding_forward(weight.device_data<float>(), dev_ids.device_data<int64_t>(),
                                      out.device_data<float>(), n, int(C), on.stream));
  return out;
}

Tensor embedding_bwd(const Tensor& grad_out, const Tensor& ids, int64_t vocab_size) {
  check_f32("embedding_backward", "grad_out", grad_out);
  int64_t C = grad_out.size(-1), n = ids.numel();
  Tensor dev_ids = ids.dtype() == DType::i64 ? ids : host_i64(ids).to(grad_out.device());
  OnDevice on(grad_out);
  Tensor dweight = Tensor::empty({vocab_size, C}, DType::f32, grad_out.device());
  // Deterministic by default: the CPU op's order of additions, the same bits on every run.
  MINIDL_CUDA_CHECK(embedding_backward(grad_out.device_data<float>(), dev_ids.device_data<int64_t>(),
                                       dweight.device_data<float>(), n, vocab_size, int(C),
                                       deterministic_embedding_backward(), on.stream));
  return dweight;
}

void register_embedding() {
  embedding_forward_device.set(DeviceKind::kCUDA, &embedding_fwd);
  embedding_backward_device.set(DeviceKind::kCUDA, &embedding_bwd);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_embedding);

}  // namespace minidl::ops::cuda
