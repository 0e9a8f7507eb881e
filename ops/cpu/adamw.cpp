#include "ops/adamw.h"

#include <vector>

#include "core/parallel.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops {

// Below this many elements per thread, the fork/join costs more than the update.
static constexpr int64_t kAdamWGrain = 1 << 14;

static void check_buffer(const Tensor& t, const char* name, const Tensor& param) {
  MINIDL_CHECK(t.defined(), "fused_adamw_: ", name, " is undefined");
  MINIDL_CHECK(t.dtype() == DType::f32, "fused_adamw_: expected ", name, " of dtype f32, got ", t.dtype());
  MINIDL_CHECK(t.is_contiguous(), "fused_adamw_: expected a contiguous ", name, ", got shape ", t.shape(),
               " with strides ", t.strides());
  MINIDL_CHECK(t.numel() == param.numel(), "fused_adamw_: expected ", name, " with ", param.numel(),
               " elements (as param), got ", t.numel());
  MINIDL_CHECK(t.device() == param.device(), "fused_adamw_: param is on ", param.device(), ", ", name, " on ",
               t.device());
}

void fused_adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& h) {
  check_buffer(param, "param", param);
  check_buffer(grad, "grad", param);
  check_buffer(m, "m", param);
  check_buffer(v, "v", param);
  MINIDL_CHECK(h.step >= 1, "fused_adamw_: expected step >= 1 (1-based), got ", h.step);
  if (!param.device().is_cpu()) return fused_adamw_device(param.device())(param, grad, m, v, h);
  fused_adamw_multi_({param}, {grad}, {m}, {v}, h);  // the same parallel pass, over one tensor
}

void fused_adamw_multi_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        const std::vector<Tensor>& m, const std::vector<Tensor>& v, const AdamWHyper& h,
                        bool zero_grads) {
  MINIDL_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
               "fused_adamw_multi_: expected lists of equal length, got ", params.size(), " params, ", grads.size(),
               " grads, ", m.size(), " m and ", v.size(), " v");
  if (params.empty()) return;
  const Device device = params.front().device();
  for (size_t i = 0; i < params.size(); ++i) {
    check_buffer(params[i], "param", params[i]);
    check_buffer(grads[i], "grad", params[i]);
    check_buffer(m[i], "m", params[i]);
    check_buffer(v[i], "v", params[i]);
    MINIDL_CHECK(params[i].device() == device, "fused_adamw_multi_: param 0 is on ", device, ", param ", i, " on ",
                 params[i].device());
  }
  MINIDL_CHECK(h.step >= 1, "fused_adamw_multi_: expected step >= 1 (1-based), got ", h.step);
  if (!device.is_cpu()) {
    fused_adamw_multi_device(device)(params, grads, m, v, h);
    if (zero_grads)
      for (const Tensor& g : grads) Tensor(g).zero_();
    return;
  }
  // One parallel pass over all the tensors (elementwise, so the bits are fused_adamw_'s one by one).
  const kernels::AdamWConstants c = kernels::adamw_constants(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step);
  std::vector<int64_t> sizes;
  for (const Tensor& p : params) sizes.push_back(p.numel());
  parallel_for_parts(sizes, kAdamWGrain, [&](size_t i, int64_t begin, int64_t end) {
    float* g = grads[i].data<float>() + begin;
    simd::adamw(params[i].data<float>() + begin, g, m[i].data<float>() + begin, v[i].data<float>() + begin, c,
                end - begin, zero_grads ? g : nullptr);
  });
}

void add_to_count_(const Tensor& skipped, int64_t delta) {
  MINIDL_CHECK(skipped.defined() && skipped.numel() == 1 && skipped.dtype() == DType::i64,
               "add_to_count_: expected one i64 count");
  if (!skipped.device().is_cpu()) return add_to_count_device(skipped.device())(skipped, delta);
  skipped.data<int64_t>()[0] += delta;
}

void fused_adamw_multi_unless_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& m, const std::vector<Tensor>& v, const AdamWHyper& h,
                               const Tensor& found_inf, const Tensor& skipped, bool count_skip) {
  MINIDL_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::i32,
               "fused_adamw_multi_unless_: expected found_inf as one i32 flag");
  MINIDL_CHECK(skipped.defined() && skipped.numel() == 1 && skipped.dtype() == DType::i64,
               "fused_adamw_multi_unless_: expected skipped as one i64 count");
  const Device device = found_inf.device();
  MINIDL_CHECK(skipped.device() == device, "fused_adamw_multi_unless_: found_inf is on ", device, ", skipped on ",
               skipped.device());
  for (const Tensor& p : params)
    MINIDL_CHECK(p.device() == device, "fused_adamw_multi_unless_: found_inf is on ", device, ", a param on ",
                 p.device());
  MINIDL_CHECK(!h.lr_on_device.defined() || (h.lr_on_device.numel() == 1 && h.lr_on_device.dtype() == DType::f64 &&
                                             h.lr_on_device.device() == device),
               "fused_adamw_multi_unless_: expected lr_on_device as one f64 on ", device);
  if (!device.is_cpu()) {
    MINIDL_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
                 "fused_adamw_multi_unless_: expected lists of equal length, got ", params.size(), " params, ",
                 grads.size(), " grads, ", m.size(), " m and ", v.size(), " v");
    for (size_t i = 0; i < params.size(); ++i) {
      check_buffer(params[i], "param", params[i]);
      check_buffer(grads[i], "grad", params[i]);
      check_buffer(m[i], "m", params[i]);
      check_buffer(v[i], "v", params[i]);
    }
    MINIDL_CHECK(h.step >= 1, "fused_adamw_multi_unless_: expected step >= 1 (1-based), got ", h.step);
    return fused_adamw_multi_unless_device(device)(params, grads, m, v, h, found_inf, skipped, count_skip);
  }
  int64_t& count = skipped.data<int64_t>()[0];
  if (found_inf.data<int32_t>()[0] != 0) {
    if (count_skip) ++count;
    return;
  }
  AdamWHyper stepped = h;
  stepped.step = h.step - count;
  if (h.lr_on_device.defined()) stepped.lr = h.lr_on_device.data<double>()[0];
  fused_adamw_multi_(params, grads, m, v, stepped);
}

}  // namespace minidl::ops
