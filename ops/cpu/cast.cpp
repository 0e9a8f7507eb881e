// Casts on the CPU: parallel conversion loops for the contiguous f32 <-> f16/bf16 cases that mixed precision
// runs every step; other layouts and dtypes take Tensor::copy_'s general path.
#include "core/parallel.h"
#include "ops/cast.h"

namespace minidl::ops {

// Elements per parallel chunk: a conversion is a few instructions per element.
static constexpr int64_t kCastGrain = 1 << 15;

template <class Src, class Dst, class Convert>
static void convert(const Tensor& src, Tensor& dst, Convert convert) {
  const Src* s = src.data<Src>();
  Dst* d = dst.data<Dst>();
  parallel_for(0, src.numel(), kCastGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = convert(s[i]);
  });
}

Tensor cast(const Tensor& t, DType dt) {
  MINIDL_CHECK(t.defined(), "cast: undefined input");
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor src = t.is_contiguous() ? t : t.detach().contiguous();
  Tensor out = Tensor::empty(src.shape(), dt, src.device());
  DType from = src.dtype();
  if (from == DType::f32 && dt == DType::bf16) {
    convert<float, bf16>(src, out, [](float v) { return to_bf16(v); });
  } else if (from == DType::f32 && dt == DType::f16) {
    convert<float, f16>(src, out, [](float v) { return to_f16(v); });
  } else if (from == DType::bf16 && dt == DType::f32) {
    convert<bf16, float>(src, out, [](bf16 v) { return to_float(v); });
  } else if (from == DType::f16 && dt == DType::f32) {
    convert<f16, float>(src, out, [](f16 v) { return to_float(v); });
  } else {
    out.copy_(src);
  }
  return out;
}

}  // namespace minidl::ops
