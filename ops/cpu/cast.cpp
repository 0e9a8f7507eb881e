// Casts on the CPU: parallel conversion loops for the contiguous f32 <-> f16/bf16 cases that mixed precision
// runs every step; other layouts and dtypes take Tensor::copy_'s general path.
//
// The four conversions run ops/cpu/simd's vector code (F16C for f16 where the CPU has AVX2), with core/half.h's
// rounding: core/half.h's portable f16 conversion branches on subnormals and does not vectorise, and made f16
// mixed precision ~4x slower than bf16.
#include <algorithm>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops {

// Elements per parallel chunk: a conversion is a few instructions per element.
static constexpr int64_t kCastGrain = 1 << 15;

// Runs a flat conversion kernel on contiguous chunks of the tensor.
template <class Src, class Dst>
static void convert(const Tensor& src, Tensor& dst, void (*kernel)(const Src*, Dst*, int64_t)) {
  const Src* s = src.data<Src>();
  Dst* d = dst.data<Dst>();
  parallel_for(0, src.numel(), kCastGrain, [&](int64_t b, int64_t e) { kernel(s + b, d + b, e - b); });
}

void cast_into(const Tensor& src, Tensor& dst) {
  MINIDL_ASSERT(src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel());
  MINIDL_CHECK(src.device() == dst.device(), "cast: src on ", src.device(), ", dst on ", dst.device());
  if (!src.device().is_cpu()) return cast_into_device_kernel(src.device())(src, dst);
  DType from = src.dtype(), dt = dst.dtype();
  if (from == DType::f32 && dt == DType::bf16) {
    convert(src, dst, &simd::f32_to_bf16);
  } else if (from == DType::f32 && dt == DType::f16) {
    convert(src, dst, &simd::f32_to_f16);
  } else if (from == DType::bf16 && dt == DType::f32) {
    convert(src, dst, &simd::bf16_to_f32);
  } else if (from == DType::f16 && dt == DType::f32) {
    convert(src, dst, &simd::f16_to_f32);
  } else {
    Tensor view = dst.detach().as_strided(src.shape(), contiguous_strides(src.shape()), 0);
    view.copy_(src);
  }
}

Tensor cast(const Tensor& t, DType dt) {
  MINIDL_CHECK(t.defined(), "cast: undefined input");
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor src = t.is_contiguous() ? t : t.detach().contiguous();
  Tensor out = Tensor::empty(src.shape(), dt, src.device());
  cast_into(src, out);
  return out;
}

int64_t half_block_rows(int64_t row_elems) {
  constexpr int64_t kBlockElems = int64_t(1) << 19;  // 2 MiB of f32: big enough for full-speed GEMMs
  return std::max<int64_t>(1, kBlockElems / std::max<int64_t>(1, row_elems));
}

Tensor half_by_row_blocks(const Tensor& x, const Shape& row_shape, const std::function<Tensor(const Tensor&)>& f32_op) {
  MINIDL_ASSERT(x.is_contiguous() && x.dim() >= 1 && is_half(x.dtype()));
  Shape out_shape{x.size(0)};
  for (int64_t d : row_shape) out_shape.push_back(d);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  // Both the f32 input block and the f32 result block stay within the block size.
  const int64_t rows = x.size(0),
                block = half_block_rows(std::max(x.numel() / std::max<int64_t>(1, rows), row_shape.numel()));
  for (int64_t r = 0; r < rows; r += block) {
    int64_t n = std::min(block, rows - r);
    Tensor y = f32_op(upcast(x.detach().narrow(0, r, n)));
    Tensor dst = out.detach().narrow(0, r, n);
    cast_into(y, dst);
  }
  return out;
}

}  // namespace minidl::ops
