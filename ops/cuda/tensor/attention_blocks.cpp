// ops/attention_blocks.h on CUDA devices: ops/cuda/attention_blocks.cu through ops/cuda/attention_blocks.h, f32
// (the op's entry checks shapes, dtypes and devices and hands contiguous tensors here).
#include "ops/attention_blocks.h"
#include "ops/cuda/attention_blocks.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

AttentionForward block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                               bool causal) {
  OnDevice on(q);
  const int64_t B = q.size(0), Tq = q.size(1), Tk = k.size(1), D = q.size(2) / n_head;
  AttentionForward f{Tensor::empty(q.shape(), DType::f32, q.device()),
                     Tensor::empty({B, n_head, Tq}, DType::f32, q.device())};
  MINIDL_CUDA_CHECK(attention_block_forward(q.device_data<float>(), k.device_data<float>(), v.device_data<float>(),
                                            f.out.device_data<float>(), f.lse.device_data<float>(), B, Tq, Tk, n_head,
                                            n_kv_head, D, causal, on.stream));
  return f;
}

AttentionBlockGrads block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, int n_head, int n_kv_head, bool causal) {
  OnDevice on(q);
  const int64_t B = q.size(0), Tq = q.size(1), Tk = k.size(1), D = q.size(2) / n_head;
  AttentionBlockGrads g{Tensor::empty(q.shape(), DType::f32, q.device()),
                        Tensor::empty(k.shape(), DType::f32, q.device()),
                        Tensor::empty(v.shape(), DType::f32, q.device())};
  Tensor delta = Tensor::empty({B, n_head, Tq}, DType::f32, q.device());
  MINIDL_CUDA_CHECK(attention_block_backward(
      dout.device_data<float>(), q.device_data<float>(), k.device_data<float>(), v.device_data<float>(),
      out.device_data<float>(), lse.device_data<float>(), delta.device_data<float>(), g.dq.device_data<float>(),
      g.dk.device_data<float>(), g.dv.device_data<float>(), B, Tq, Tk, n_head, n_kv_head, D, causal, on.stream));
  return g;
}

void merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  OnDevice on(out);
  const int64_t H = lse.size(1);
  MINIDL_CUDA_CHECK(merge_attention_blocks(out.device_data<float>(), lse.device_data<float>(),
                                           out_b.device_data<float>(), lse_b.device_data<float>(), out.size(0),
                                           out.size(1), H, out.size(2) / H, on.stream));
}

void register_attention_blocks() {
  attention_block_forward_device.set(DeviceKind::kCUDA, &block_forward);
  attention_block_backward_device.set(DeviceKind::kCUDA, &block_backward);
  merge_attention_blocks_device.set(DeviceKind::kCUDA, &merge);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_attention_blocks);

}  // namespace minidl::ops::cuda
