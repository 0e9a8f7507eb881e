// SwiGLU on the CPU: elementwise loops over contiguous memory, parallel over elements. f32 runs ops/cpu/simd's
// vector code; f64 (the gradient-check path) the scalar reference of ops/kernels/swiglu.h with std::exp. 16-bit
// inputs are computed in f32 and rounded once.
#include <type_traits>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/swiglu.h"
#include "ops/swiglu.h"

namespace minidl::ops {

// Elements per parallel chunk: enough work to amortise waking a thread (an exp and a division each).
static constexpr int64_t kElementGrain = 4096;

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  check_swiglu("swiglu", gate, up);
  if (!gate.device().is_cpu()) return swiglu_forward_device(gate.device())(gate, up);
  if (is_half(gate.dtype())) return cast(swiglu_forward(upcast(gate), upcast(up)), gate.dtype());
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  dispatch_float("swiglu", gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pg = gate.data<T>(), *pu = up.data<T>();
    T* py = y.data<T>();
    parallel_for(0, gate.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        simd::swiglu_row(pg + b, pu + b, py + b, e - b);
      else
        for (int64_t i = b; i < e; ++i) py[i] = kernels::swiglu(pg[i], pu[i]);
    });
  });
  return y;
}

SwiGLUBackward swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  check_swiglu("swiglu_backward", gate, up);
  check_shaped_like("swiglu_backward", "dy", dy, gate.shape(), gate);
  if (!gate.device().is_cpu()) return swiglu_backward_device(gate.device())(dy, gate, up);
  if (is_half(gate.dtype())) {
    SwiGLUBackward g = swiglu_backward(upcast(dy), upcast(gate), upcast(up));
    return {cast(g.dgate, gate.dtype()), cast(g.dup, gate.dtype())};
  }
  SwiGLUBackward g{Tensor::empty(gate.shape(), gate.dtype(), gate.device()),
                   Tensor::empty(gate.shape(), gate.dtype(), gate.device())};
  dispatch_float("swiglu_backward", gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pdy = dy.data<T>(), *pg = gate.data<T>(), *pu = up.data<T>();
    T *pdg = g.dgate.data<T>(), *pdu = g.dup.data<T>();
    parallel_for(0, gate.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        simd::swiglu_backward_row(pdy + b, pg + b, pu + b, pdg + b, pdu + b, e - b);
      else
        for (int64_t i = b; i < e; ++i) kernels::swiglu_grad(pdy[i], pg[i], pu[i], pdg + i, pdu + i);
    });
  });
  return g;
}

}  // namespace minidl::ops
