// ops/attention.h on CUDA devices: 16-bit inputs with head dimension 32, 64 or 128 on tensor cores
// (ops/cuda/flash_attention.h: 16-bit operands, f32 accumulation); f32 through ops/cuda/attention.h; other 16-bit
// inputs through an f32 copy, as on the CPU (ops/cast.h). Every kernel takes grouped kv heads (n_kv_head < n_head)
// in place, without repeating K and V.
#include <type_traits>

#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

// The device pointer of a contiguous f16/bf16 tensor as the toolkit's type.
template <class Half>
Half* half_data(const Tensor& t) {
  if constexpr (std::is_same_v<Half, __half>)
    return reinterpret_cast<Half*>(t.device_data<f16>());
  else
    return reinterpret_cast<Half*>(t.device_data<bf16>());
}

// Calls fn(Half{}) with Half the toolkit's type of 16-bit `dt`.
template <class Fn>
void dispatch_half(DType dt, Fn&& fn) {
  if (dt == DType::f16)
    fn(__half{});
  else
    fn(__nv_bfloat16{});
}

// 16-bit attention on tensor cores (flash_attention.h); other head dimensions take the f32 kernel on an f32 copy.
AttentionForward attention_forward(const Tensor& qkv, int n_head, int n_kv_head);
AttentionForward half_attention_forward(const Tensor& qkv16, const AttentionDims& d) {
  const Tensor qkv = qkv16.contiguous();
  AttentionForward f{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                     Tensor::empty({d.B, d.H, d.T}, DType::f32, qkv.device())};
  if (!flash_attention_supports(int(d.D))) {
    AttentionForward f32 = attention_forward(upcast(qkv), int(d.H), int(d.Hkv));
    cast_into(f32.out, f.out);
    return {f.out, f32.lse};
  }
  OnDevice on(qkv);
  dispatch_half(qkv.dtype(), [&](auto tag) {
    using Half = decltype(tag);
    MINIDL_CUDA_CHECK(flash_attention_forward(half_data<Half>(qkv), half_data<Half>(f.out), f.lse.device_data<float>(),
                                              int(d.B), int(d.T), int(d.C), int(d.H), int(d.Hkv), on.stream));
  });
  return f;
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int n_head,
                          int n_kv_head);
Tensor half_attention_backward(const Tensor& dout16, const Tensor& qkv16, const Tensor& out16, const Tensor& lse,
                               const AttentionDims& d) {
  const Tensor qkv = qkv16.contiguous(), dout = dout16.contiguous(), out = out16.contiguous();
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  if (!flash_attention_supports(int(d.D))) {
    cast_into(attention_backward(upcast(dout), upcast(qkv), upcast(out), lse.contiguous(), int(d.H), int(d.Hkv)), dqkv);
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
                                               int(d.Hkv), on.stream));
  });
  return dqkv;
}

AttentionForward attention_forward(const Tensor& qkv, int n_head, int n_kv_head) {
  if (is_half(qkv.dtype())) return half_attention_forward(qkv, check_causal_attention(qkv, n_head, n_kv_head));
  check_f32("causal_attention", "qkv", qkv);
  AttentionDims d = check_causal_attention(qkv, n_head, n_kv_head);
  MINIDL_CHECK(d.D == 16 || d.D == 32 || d.D == 64,
               "causal_attention: the CUDA kernel takes head dimension 16, 32 "
               "or 64, got C / n_head = ",
               d.C, " / ", d.H, " = ", d.D);
  OnDevice on(qkv);
  AttentionForward f{Tensor::empty({d.B, d.T, d.C}, DType::f32, qkv.device()),
                     Tensor::empty({d.B, d.H, d.T}, DType::f32, qkv.device())};
  MINIDL_CUDA_CHECK(causal_attention_forward(qkv.device_data<float>(), f.out.device_data<float>(),
                                             f.lse.device_data<float>(), int(d.B), int(d.T), int(d.C), int(d.H),
                                             int(d.Hkv), on.stream));
  return f;
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int n_head,
                          int n_kv_head) {
  if (is_half(qkv.dtype()))
    return half_attention_backward(dout, qkv, out, lse, check_causal_attention(qkv, n_head, n_kv_head));
  check_f32("causal_attention_backward", "qkv", qkv);
  AttentionDims d = check_causal_attention(qkv, n_head, n_kv_head);
  OnDevice on(qkv);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32, qkv.device());
  Tensor scratch = Tensor::empty({int64_t(causal_attention_backward_scratch_floats(int(d.B), int(d.T), int(d.H)))},
                                 DType::f32, qkv.device());
  MINIDL_CUDA_CHECK(causal_attention_backward(dout.device_data<float>(), qkv.device_data<float>(),
                                              out.device_data<float>(), lse.device_data<float>(),
                                              dqkv.device_data<float>(), scratch.device_data<float>(), int(d.B),
                                              int(d.T), int(d.C), int(d.H), int(d.Hkv), on.stream));
  return dqkv;
}

void register_attention() {
  causal_attention_forward_device.set(DeviceKind::kCUDA, &attention_forward);
  causal_attention_backward_device.set(DeviceKind::kCUDA, &attention_backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_attention);

}  // namespace minidl::ops::cuda
