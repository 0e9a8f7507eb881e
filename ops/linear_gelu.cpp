// ops/linear_gelu.h: validation, the CUDA device's fused GEMM where it has one, and the composition of existing
// ops everywhere else (the CPU, and the fallback on CUDA).
#include "ops/linear_gelu.h"

#include <atomic>

#include "ops/cast.h"
#include "ops/gelu.h"
#include "ops/matmul.h"
#include "ops/nn_checks.h"
#include "ops/reduce.h"

namespace minidl::ops {
namespace {

std::atomic<bool> epilogues_enabled{true};

// t: (..., C) -> (rows, C), contiguous.
Tensor rows_of(const Tensor& t) {
  return t.detach().contiguous().view(Shape{t.numel() / std::max<int64_t>(t.size(-1), 1), t.size(-1)});
}

Shape with_last(const Tensor& t, int64_t last) {
  Shape s = t.shape();
  s[s.size() - 1] = last;
  return s;
}

bool fused(const Tensor& t, bool has_kernel) { return t.device().is_cuda() && epilogues_enabled && has_kernel; }

}  // namespace

void set_gemm_epilogues_enabled(bool enabled) { epilogues_enabled = enabled; }
bool gemm_epilogues_enabled() { return epilogues_enabled; }

LinearGelu linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_float_or_half("linear_gelu", "x", x);
  MINIDL_CHECK(x.dim() >= 1, "linear_gelu: expected x of shape (..., k), got ", x.shape());
  check_defined("linear_gelu", "w", w);
  MINIDL_CHECK(w.dim() == 2, "linear_gelu: expected w of shape (k, n), got ", w.shape());
  const int64_t n = w.size(1);
  check_shaped_like("linear_gelu", "w", w, Shape{x.size(-1), n}, x);
  if (bias.defined()) check_shaped_like("linear_gelu", "bias", bias, Shape{n}, x);
  if (fused(x, linear_gelu_device.has(x.device()))) {
    if (std::optional<LinearGelu> f = linear_gelu_device(x.device())(
            rows_of(x), w.detach().contiguous(), bias.defined() ? bias.detach().contiguous() : Tensor()))
      return {f->h.view(with_last(x, n)), f->aux.view(with_last(x, n))};
  }
  Tensor aux = linear(x.detach(), w.detach(), bias.defined() ? bias.detach() : Tensor());
  return {gelu_forward(aux), aux};
}

DgeluBgrad dgelu_bgrad(const Tensor& dy, const Tensor& w, const Tensor& aux, bool bias_grad) {
  check_float_or_half("dgelu_bgrad", "aux", aux);
  check_defined("dgelu_bgrad", "dy", dy);
  MINIDL_CHECK(aux.dim() >= 1 && dy.dim() == aux.dim(),
               "dgelu_bgrad: expected dy (..., k) and aux (..., n) of one "
               "rank, got dy ",
               dy.shape(), " and aux ", aux.shape());
  const int64_t n = aux.size(-1), k = dy.size(-1);
  check_shaped_like("dgelu_bgrad", "dy", dy, with_last(aux, k), aux);
  check_shaped_like("dgelu_bgrad", "w", w, Shape{n, k}, aux);
  if (fused(aux, dgelu_bgrad_device.has(aux.device()))) {
    if (std::optional<DgeluBgrad> g =
            dgelu_bgrad_device(aux.device())(rows_of(dy), w.detach().contiguous(), rows_of(aux), bias_grad))
      return {g->dpre.view(aux.shape()), g->dbias};
  }
  Tensor dh = matmul(dy.detach(), w.detach(), false, true);
  if (!bias_grad) return {gelu_backward(dh, aux.detach()), Tensor()};
  // bias_gelu's backward with a zero bias (aux already holds it): dpre and its fixed-order column sums in the
  // kernels the unfused MLP runs, so both paths give the same bits in f32.
  BiasGeluBackward g = bias_gelu_backward(dh, aux.detach(), Tensor::zeros({aux.size(-1)}, aux.dtype(), aux.device()));
  return {g.dx, g.dbias};
}

LinearGrad linear_weight_bias_grad(const Tensor& x2, const Tensor& dy2, bool f32_out) {
  check_defined("linear_weight_bias_grad", "x", x2);
  check_defined("linear_weight_bias_grad", "dy", dy2);
  MINIDL_CHECK(x2.dim() == 2 && dy2.dim() == 2 && x2.size(0) == dy2.size(0), "linear_weight_bias_grad: expected x ",
               "(rows, k) and dy (rows, n) with the same rows, got x ", x2.shape(), " and dy ", dy2.shape());
  const bool f32 = f32_out && is_half(x2.dtype());
  if (fused(x2, linear_weight_bias_grad_device.has(x2.device()))) {
    const Tensor x = x2.detach().contiguous(), dy = dy2.detach().contiguous();
    check_float_or_half("linear_weight_bias_grad", "x", x);
    check_like("linear_weight_bias_grad", "dy", dy, x);
    if (std::optional<LinearGrad> g = linear_weight_bias_grad_device(x.device())(x, dy, f32)) return *g;
  }
  if (x2.device().is_cpu() && x2.dtype() == DType::f32 && dy2.dtype() == DType::f32) {  // one parallel region
    LinearGrad g{Tensor::empty({x2.size(1), dy2.size(1)}), Tensor::empty({dy2.size(1)})};
    linear_weight_bias_grad_into(g.dw, g.dbias, x2.detach(), dy2.detach(), /*accumulate=*/false);
    return g;
  }
  // The unfused path: the product, and the column sums (of an exact f32 copy for an f32 result: the same f32
  // sums, not rounded to 16 bits).
  return {f32 ? matmul_f32(x2.detach(), dy2.detach(), true, false) : matmul(x2.detach(), dy2.detach(), true, false),
          sum(f32 ? upcast(dy2.detach()) : dy2.detach(), 0)};
}

}  // namespace minidl::ops
