// Rotary position embedding (RoPE) with GPT-NeoX's / Hugging Face's `rotate_half` layout, without autograd.
//
//   ops::RopeTables t = ops::rope_tables(max_positions, D, 10000.0, {});   // f32 (max_positions, D / 2)
//   Tensor q_rot = ops::rope_forward(q, t.cos, t.sin, position_offset);     // q: (B, T, H, D)
//   Tensor dq = ops::rope_backward(dq_rot, t.cos, t.sin, position_offset);
//
// Layout: x is (B, T, H, D), the heads of ops/attention.h's q and k ((B, T, C) with head h at columns
// [h D, (h + 1) D)) viewed as (B, T, H, D). The two halves of each head rotate together (not interleaved pairs, as
// Meta's GPT-J-style checkpoints store them): for i < D / 2, p = position_offset + t and a = p * inv_freq[i],
//
//   y[i]         = x[i] cos a - x[i + D/2] sin a
//   y[i + D/2]   = x[i + D/2] cos a + x[i] sin a
//
// (HF's q * cos + rotate_half(q) * sin). position_offset places the T rows at positions [offset, offset + T) of
// the tables: a KV cache's new tokens, or a slice of a longer sequence. Backward is the transpose, the rotation by
// -a. 16-bit x is rotated in f32 (the tables stay f32) and rounded once to x's dtype.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// transformers' rope_scaling (modeling_rope_utils.py), on the inverse frequencies inv_freq[i] = theta^(-2i / D):
//   kNone:   as they are;
//   kLinear: inv_freq / factor (positions interpolated);
//   kLlama3: three wavelength bands, wavelen = 2 pi / inv_freq, against original_max_position_embeddings L:
//            wavelen < L / high_freq_factor: unchanged; wavelen > L / low_freq_factor: / factor; in between,
//            (1 - s) inv_freq / factor + s inv_freq with s = (L / wavelen - low_freq_factor) /
//            (high_freq_factor - low_freq_factor).
enum class RopeType { kNone, kLinear, kLlama3 };
struct RopeScaling {
  RopeType type = RopeType::kNone;
  double factor = 1.0;                           // kLinear, kLlama3
  double low_freq_factor = 1.0;                  // kLlama3
  double high_freq_factor = 4.0;                 // kLlama3
  int64_t original_max_position_embeddings = 0;  // kLlama3 (> 0): the pre-training context, from the config
};

// (head_dim / 2) f32 on the CPU: the scaled inverse frequencies, computed in double and rounded once.
Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

struct RopeTables {
  Tensor cos;  // (positions, head_dim / 2) f32 on the CPU: cos(p * inv_freq[i]), p * inv_freq[i] an f32 product
  Tensor sin;  // the same, sin
};
// head_dim even, theta > 0, positions >= 1. Move the tables to x's device once (to(device)); every layer shares them.
RopeTables rope_tables(int64_t positions, int64_t head_dim, double theta, const RopeScaling& scaling);

// x: (B, T, H, D) contiguous, f32/f64 or f16/bf16 storage; cos, sin: (P, D / 2) f32 (f64 for f64 x), on x's device,
// P >= position_offset + T -> like x.
Tensor rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset);
// dy: like x -> dx, the rotation of dy by the negated angles.
Tensor rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, int64_t position_offset);

// The CUDA kernels (ops/cuda/tensor/rope.cpp), filled by minidl::cuda::register_backend(); `inverse` selects the
// backward's rotation.
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, bool)> rope_device{"rope"};

// ---- argument checks, shared by every backend's entry ----
// The dtype of the tables for x: f64 for f64 x (gradient checks), f32 otherwise.
inline DType rope_table_dtype(const Tensor& x) { return x.dtype() == DType::f64 ? DType::f64 : DType::f32; }

inline void check_rope(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  check_float_or_half(op, "x", x);
  MINIDL_CHECK(x.dim() == 4 && x.size(3) > 0 && x.size(3) % 2 == 0, op,
               ": expected x of shape (B, T, H, D) with D even, got ", x.shape());
  MINIDL_CHECK(position_offset >= 0, op, ": expected position_offset >= 0, got ", position_offset);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"cos", cos}, {"sin", sin}}) {
    check_contiguous(op, name, t);
    MINIDL_CHECK(t.dtype() == rope_table_dtype(x), op, ": expected ", name, " to have dtype ", rope_table_dtype(x),
                 " for x of dtype ", x.dtype(), ", got ", t.dtype());
    MINIDL_CHECK(t.device() == x.device(), op, ": expected ", name, " on ", x.device(), ", got ", t.device());
    MINIDL_CHECK(t.dim() == 2 && t.size(1) == x.size(3) / 2 && t.size(0) >= position_offset + x.size(1), op,
                 ": expected ", name, " of shape (P, ", x.size(3) / 2,
                 ") with P >= position_offset + T = ", position_offset + x.size(1), ", got ", t.shape());
  }
}

}  // namespace minidl::ops
