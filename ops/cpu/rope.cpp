// RoPE on the CPU: its tables (inverse frequencies with rope_scaling, cos and sin) and the rotation, parallel over
// (batch, position) rows of H heads. f32 runs ops/cpu/simd's vector code; f64 (the gradient-check path) the scalar
// rotation of ops/kernels/rope.h, with the same order of operations. 16-bit x is rotated on its exact f32 copy and
// rounded once (the CUDA kernel reads 16-bit storage directly and computes the same f32 math).
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/rope.h"
#include "ops/rope.h"

namespace minidl::ops {

Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling) {
  MINIDL_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: expected an even head_dim > 0, got ", head_dim);
  MINIDL_CHECK(theta > 0, "rope: expected theta > 0, got ", theta);
  if (scaling.type != RopeType::kNone)
    MINIDL_CHECK(scaling.factor > 0, "rope: expected rope_scaling factor > 0, got ", scaling.factor);
  if (scaling.type == RopeType::kLlama3) {
    MINIDL_CHECK(scaling.original_max_position_embeddings > 0,
                 "rope: llama3 scaling expects original_max_position_embeddings > 0, got ",
                 scaling.original_max_position_embeddings);
    MINIDL_CHECK(scaling.high_freq_factor > scaling.low_freq_factor && scaling.low_freq_factor > 0,
                 "rope: llama3 scaling expects 0 < low_freq_factor < high_freq_factor, got low_freq_factor ",
                 scaling.low_freq_factor, " and high_freq_factor ", scaling.high_freq_factor);
  }
  const int64_t half = head_dim / 2;
  Tensor inv = Tensor::empty({half}, DType::f32);
  float* out = inv.data<float>();
  const double L = double(scaling.original_max_position_embeddings);
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
    if (scaling.type == RopeType::kLinear) f /= scaling.factor;
    if (scaling.type == RopeType::kLlama3) {
      const double wavelen = 2 * M_PI / f;
      const double low_wavelen = L / scaling.low_freq_factor, high_wavelen = L / scaling.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= scaling.factor;
      } else if (wavelen >= high_wavelen) {  // the medium band: between f / factor and f
        const double s = (L / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1 - s) * f / scaling.factor + s * f;
      }
    }
    out[i] = float(f);
  }
  return inv;
}

RopeTables rope_tables(int64_t positions, int64_t head_dim, double theta, const RopeScaling& scaling) {
  MINIDL_CHECK(positions >= 1, "rope: expected positions >= 1, got ", positions);
  const Tensor inv = rope_inv_freq(head_dim, theta, scaling);
  const int64_t half = head_dim / 2;
  RopeTables t{Tensor::empty({positions, half}, DType::f32), Tensor::empty({positions, half}, DType::f32)};
  const float* f = inv.data<float>();
  float *c = t.cos.data<float>(), *s = t.sin.data<float>();
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(p) * f[i];  // an f32 product, as transformers' position_ids @ inv_freq
      c[p * half + i] = float(std::cos(double(angle)));
      s[p * half + i] = float(std::sin(double(angle)));
    }
  return t;
}

static Tensor rope(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
                   bool inverse) {
  check_rope(op, x, cos, sin, position_offset);
  if (!x.device().is_cpu()) return rope_device(x.device())(x, cos, sin, position_offset, inverse);
  if (is_half(x.dtype())) return cast(rope(op, upcast(x), cos, sin, position_offset, inverse), x.dtype());
  const int64_t T = x.size(1), H = x.size(2), half = x.size(3) / 2, rows = x.size(0) * T;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using F = decltype(tag);
    const F *px = x.data<F>(), *pc = cos.data<F>(), *ps = sin.data<F>();
    F* py = y.data<F>();
    parallel_for(0, rows, std::max<int64_t>(1, 4096 / (H * 2 * half)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t p = position_offset + r % T;
        const F *xr = px + r * H * 2 * half, *cr = pc + p * half, *sr = ps + p * half;
        F* yr = py + r * H * 2 * half;
        if constexpr (std::is_same_v<F, float>) {
          simd::rope_rows(xr, cr, sr, yr, H, half, inverse);
          continue;
        }
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const F* xh = xr + h * 2 * half;
            F* yh = yr + h * 2 * half;
            kernels::rope_rotate(xh[i], xh[i + half], cr[i], inverse ? -sr[i] : sr[i], yh + i, yh + i + half);
          }
      }
    });
  });
  return y;
}

Tensor rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  return rope("rope", x, cos, sin, position_offset, false);
}

Tensor rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  return rope("rope_backward", dy, cos, sin, position_offset, true);
}

}  // namespace minidl::ops
