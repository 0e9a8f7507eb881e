// The fused neural-network ops on CUDA devices: causal attention, cross-entropy, embedding, dropout, casts,
// AdamW and unscale-and-check, each a thin call of its launcher in ops/cuda/<kernel>.h (attention's tensor-core
// kernels: ops/cuda/flash_attention.h). The kernels compute in f32; 16-bit attention with head dimension 32, 64
// or 128 runs on tensor cores (16-bit operands, f32 accumulation), any other 16-bit input of attention or dropout
// goes through f32 as on the CPU (ops/cast.h).
#include <type_traits>
#include <vector>

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cross_entropy.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cast.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/dropout.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/tensor/register.h"
#include "ops/cuda/unscale.h"
#include "ops/dropout.h"
#include "ops/embedding.h"
#include "ops/kernels/adamw.h"
#include "ops/unscale.h"

namespace minidl::ops::cuda {
namespace {

// A host copy of device ids or targets (validated there: the kernels index with them unchecked), as i64.
Tensor host_i64(const Tensor& t) { return cast(t.to(Device::cpu()).detach(), DType::i64); }

// A small device tensor holding host values.
Tensor device_i64(int64_t value, Device device) { return Tensor::full({1}, double(value), DType::i64, device); }

// ---- attention ----
// The device pointer of a contiguous f16/bf16 tensor as the toolkit's type.
template <class Half>
Half* half_data(const Tensor& t) {
  if constexpr (std::is_same_v<Half, __half>) return reinterpret_cast<Half*>(t.device_data<f16>());
  else return reinterpret_cast<Half*>(t.device_data<bf16>());
}

// Calls fn(Half{}) with Half the toolkit's type of 16-bit `dt`.
template <class Fn>
void dispatch_half(DType dt, Fn&& fn) {
  if (dt == DType::f16) fn(__half{});
  else fn(__nv_bfloat16{});
}

// 16-bit attention on tensor cores (flash_attention.h); other head dimensions take the f32 kernel on an f32 copy.
AttentionForward attention_forward(const Tensor& qkv, int n_head);
AttentionForward half_attention_forward(const Tensor& qkv16, const AttentionDims& d) {
  const Tensor qkv = qkv16.contiguous();
  AttentionForward f{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                     Tensor::empty({d.B, d.H, d.T}, DType::f32, qkv.device())};
  if (!flash_attention_supports(int(d.D))) {
    AttentionForward f32 = attention_forward(upcast(qkv), int(d.H));
    cast_into(f32.out, f.out);
    return {f.out, f32.lse};
  }
  OnDevice on(qkv);
  dispatch_half(qkv.dtype(), [&](auto tag) {
    using Half = decltype(tag);
    MINIDL_CUDA_CHECK(flash_attention_forward(half_data<Half>(qkv), half_data<Half>(f.out), f.lse.device_data<float>(),
                                              int(d.B), int(d.T), int(d.C), int(d.H), on.stream));
  });
  return f;
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int n_head);
Tensor half_attention_backward(const Tensor& dout16, const Tensor& qkv16, const Tensor& out16, const Tensor& lse,
                               const AttentionDims& d) {
  const Tensor qkv = qkv16.contiguous(), dout = dout16.contiguous(), out = out16.contiguous();
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  if (!flash_attention_supports(int(d.D))) {
    cast_into(attention_backward(upcast(dout), upcast(qkv), upcast(out), lse.contiguous(), int(d.H)), dqkv);
    return dqkv;
  }
  OnDevice on(qkv);
  Tensor scratch = Tensor::empty({int64_t(flash_attention_backward_scratch_floats(int(d.B), int(d.T), int(d.H)))},
                                 DType::f32, qkv.device());
  const Tensor l = lse.contiguous();
  dispatch_half(qkv.dtype(), [&](auto tag) {
    using Half = decltype(tag);
    MINIDL_CUDA_CHECK(flash_attention_backward(half_data<Half>(dout), half_data<Half>(qkv), half_data<Half>(out),
                                               l.device_data<float>(), half_data<Half>(dqkv),
                                               scratch.device_data<float>(), int(d.B), int(d.T), int(d.C), int(d.H),
                                               on.stream));
  });
  return dqkv;
}

AttentionForward attention_forward(const Tensor& qkv, int n_head) {
  if (is_half(qkv.dtype())) return half_attention_forward(qkv, check_causal_attention(qkv, n_head));
  check_f32("causal_attention", "qkv", qkv);
  AttentionDims d = check_causal_attention(qkv, n_head);
  MINIDL_CHECK(d.D == 16 || d.D == 32 || d.D == 64, "causal_attention: the CUDA kernel takes head dimension 16, 32 "
               "or 64, got C / n_head = ", d.C, " / ", d.H, " = ", d.D);
  OnDevice on(qkv);
  AttentionForward f{Tensor::empty({d.B, d.T, d.C}, DType::f32, qkv.device()),
                     Tensor::empty({d.B, d.H, d.T}, DType::f32, qkv.device())};
  MINIDL_CUDA_CHECK(causal_attention_forward(qkv.device_data<float>(), f.out.device_data<float>(),
                                             f.lse.device_data<float>(), int(d.B), int(d.T), int(d.C), int(d.H),
                                             on.stream));
  return f;
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int n_head) {
  if (is_half(qkv.dtype())) return half_attention_backward(dout, qkv, out, lse, check_causal_attention(qkv, n_head));
  check_f32("causal_attention_backward", "qkv", qkv);
  AttentionDims d = check_causal_attention(qkv, n_head);
  OnDevice on(qkv);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32, qkv.device());
  Tensor scratch = Tensor::empty(
      {int64_t(causal_attention_backward_scratch_floats(int(d.B), int(d.T), int(d.H)))}, DType::f32, qkv.device());
  MINIDL_CUDA_CHECK(causal_attention_backward(dout.device_data<float>(), qkv.device_data<float>(),
                                              out.device_data<float>(), lse.device_data<float>(),
                                              dqkv.device_data<float>(), scratch.device_data<float>(), int(d.B),
                                              int(d.T), int(d.C), int(d.H), on.stream));
  return dqkv;
}

// ---- cross-entropy ----
// The targets are checked on a host copy (which also gives the count the mean divides by): one small transfer
// that synchronises, as reading the loss does anyway.
CrossEntropyForward cross_entropy_fwd(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                      Reduction reduction) {
  check_f32("cross_entropy", "logits", logits);
  int64_t N = logits.size(0), V = logits.size(1);
  // Targets the caller checked on the host before upload (HostCheckedIndicesGuard) need no copy for a sum: its
  // backward divides by 1, not by the count.
  const bool checked = indices_checked_on_host() && targets.dtype() == DType::i64 && reduction == Reduction::kSum;
  Tensor host_targets = checked ? Tensor() : host_i64(targets);
  CrossEntropyForward f{Tensor::empty({}, DType::f32, logits.device()), Tensor::empty({N}, DType::f32, logits.device()),
                        checked ? 0 : cross_entropy_count_targets(host_targets, V, ignore_index)};
  Tensor ids = targets.dtype() == DType::i64 ? targets : host_targets.to(logits.device());
  OnDevice on(logits);
  Tensor row_loss = Tensor::empty({N}, DType::f32, logits.device());
  Tensor count = Tensor::empty({1}, DType::i64, logits.device());
  MINIDL_CUDA_CHECK(cross_entropy_forward(logits.device_data<float>(), ids.device_data<int64_t>(),
                                          f.lse.device_data<float>(), row_loss.device_data<float>(),
                                          f.loss.device_data<float>(), count.device_data<int64_t>(), N, V,
                                          ignore_index, reduction == Reduction::kMean, on.stream));
  return f;
}

Tensor cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                         int64_t divisor, int64_t ignore_index) {
  check_f32("cross_entropy_backward", "logits", logits);
  int64_t N = logits.size(0), V = logits.size(1);
  Tensor ids = targets.dtype() == DType::i64 ? targets : host_i64(targets).to(logits.device());
  Tensor d = dloss.to(logits.device());
  Tensor div = device_i64(divisor, logits.device());
  OnDevice on(logits);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::f32, logits.device());
  MINIDL_CUDA_CHECK(cross_entropy_backward(d.device_data<float>(), logits.device_data<float>(),
                                           ids.device_data<int64_t>(), lse.device_data<float>(),
                                           div.device_data<int64_t>(), dlogits.device_data<float>(), N, V,
                                           ignore_index, on.stream));
  return dlogits;
}

// ---- embedding ----
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

// ---- dropout ----
Tensor dropout_fwd(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset) {
  check_f32("dropout", "x", x);
  OnDevice on(x);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  MINIDL_CUDA_CHECK(dropout(x.device_data<float>(), y.device_data<float>(), x.numel(), p, seed, stream, offset,
                            on.stream));
  return y;
}

// ---- casts (contiguous src and dst of the same element count) ----
bool cast_kernel(const Tensor& src, Tensor& dst) {
  OnDevice on(src);
  int64_t n = src.numel();
  DType from = src.dtype(), to = dst.dtype();
  if (from == DType::f32 && to == DType::f16)
    MINIDL_CUDA_CHECK(cast_f32_to_f16(src.device_data<float>(), reinterpret_cast<__half*>(dst.device_data<f16>()), n, on.stream));
  else if (from == DType::f32 && to == DType::bf16)
    MINIDL_CUDA_CHECK(cast_f32_to_bf16(src.device_data<float>(), reinterpret_cast<__nv_bfloat16*>(dst.device_data<bf16>()), n, on.stream));
  else if (from == DType::f16 && to == DType::f32)
    MINIDL_CUDA_CHECK(cast_f16_to_f32(reinterpret_cast<const __half*>(src.device_data<f16>()), dst.device_data<float>(), n, on.stream));
  else if (from == DType::bf16 && to == DType::f32)
    MINIDL_CUDA_CHECK(cast_bf16_to_f32(reinterpret_cast<const __nv_bfloat16*>(src.device_data<bf16>()), dst.device_data<float>(), n, on.stream));
  else
    return false;
  return true;
}

void cast_into_device(const Tensor& src, Tensor& dst) {
  if (!cast_kernel(src, dst)) dst.detach().view(src.shape()).copy_(src);  // other pairs: core's converting copy
}

// ---- AdamW and unscale ----
void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& h) {
  OnDevice on(param);
  AdamWTensor t{param.device_data<float>(), grad.device_data<float>(), m.device_data<float>(), v.device_data<float>(),
                param.numel()};
  MINIDL_CUDA_CHECK(fused_adamw(&t, 1, kernels::adamw_constants(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step),
                                on.stream));
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

// The overflow flag lives on the device; reading it back is the one synchronisation of the call.
bool unscale(const Tensor& grad, float inv_scale) {
  OnDevice on(grad);
  Tensor flag = Tensor::zeros({1}, DType::i32, grad.device());
  MINIDL_CUDA_CHECK(unscale_and_check(grad.device_data<float>(), grad.numel(), inv_scale, flag.device_data<int>(),
                                      on.stream));
  return flag.item() != 0;
}

bool unscale_multi(const std::vector<Tensor>& grads, float inv_scale) {
  OnDevice on(grads.front());
  Tensor flag = Tensor::zeros({1}, DType::i32, grads.front().device());
  for (const Tensor& g : grads)
    MINIDL_CUDA_CHECK(unscale_and_check(g.device_data<float>(), g.numel(), inv_scale, flag.device_data<int>(),
                                        on.stream));
  return flag.item() != 0;
}

}  // namespace

void register_nn() {
  causal_attention_forward_device.set(DeviceKind::kCUDA, &attention_forward);
  causal_attention_backward_device.set(DeviceKind::kCUDA, &attention_backward);
  cross_entropy_forward_device.set(DeviceKind::kCUDA, &cross_entropy_fwd);
  cross_entropy_backward_device.set(DeviceKind::kCUDA, &cross_entropy_bwd);
  embedding_forward_device.set(DeviceKind::kCUDA, &embedding_fwd);
  embedding_backward_device.set(DeviceKind::kCUDA, &embedding_bwd);
  dropout_device.set(DeviceKind::kCUDA, &dropout_fwd);
  cast_into_device_kernel.set(DeviceKind::kCUDA, &cast_into_device);
  fused_adamw_device.set(DeviceKind::kCUDA, &adamw);
  fused_adamw_multi_device.set(DeviceKind::kCUDA, &adamw_multi);
  unscale_and_check_device.set(DeviceKind::kCUDA, &unscale);
  unscale_and_check_multi_device.set(DeviceKind::kCUDA, &unscale_multi);
}

}  // namespace minidl::ops::cuda
