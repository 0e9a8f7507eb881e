// sample_windows_ on the CPU: the plain loop the CUDA kernel is held to (and data::BatchSampler's arithmetic).
#include "ops/sample_windows.h"

#include "ops/kernels/sample_windows.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

void sample_windows_(const Tensor& tokens, int64_t seq, const WindowDraw& d, const Tensor& x, const Tensor& y) {
  MINIDL_CHECK(tokens.dtype() == DType::i32 && tokens.dim() == 1,
               "sample_windows: expected tokens as a 1-D i32 "
               "tensor, got ",
               tokens.dtype(), " ", tokens.shape());
  MINIDL_CHECK(seq >= 1 && tokens.numel() >= seq + 1,
               "sample_windows: expected seq >= 1 and at least seq + 1 = ", seq + 1, " tokens, got seq ", seq, " and ",
               tokens.numel(), " tokens");
  MINIDL_CHECK(
      x.dtype() == DType::i64 && y.dtype() == DType::i64 && x.dim() == 2 && x.shape() == y.shape() && x.size(1) == seq,
      "sample_windows: expected x and y as (n, seq = ", seq, ") i64, got ", x.dtype(), " ", x.shape(), " and ",
      y.dtype(), " ", y.shape());
  const int64_t n = x.size(0);
  MINIDL_CHECK(d.begin >= 0 && n >= 1 && d.begin + n <= d.global_batch, "sample_windows: slice [", d.begin, ", ",
               d.begin + n, ") is not a non-empty part of the global batch [0, ", d.global_batch, ")");
  MINIDL_CHECK(x.device() == tokens.device() && y.device() == tokens.device(),
               "sample_windows: expected x and y "
               "on the tokens' device ",
               tokens.device(), ", got ", x.device(), " and ", y.device());
  check_contiguous("sample_windows", "tokens", tokens);
  check_contiguous("sample_windows", "x", x);
  check_contiguous("sample_windows", "y", y);
  if (d.step_on_device.defined())
    MINIDL_CHECK(d.step_on_device.dtype() == DType::i64 && d.step_on_device.numel() == 1 &&
                     d.step_on_device.device() == tokens.device(),
                 "sample_windows: expected the step as one i64 on ", tokens.device(), ", got ",
                 d.step_on_device.dtype(), " ", d.step_on_device.shape(), " on ", d.step_on_device.device());
  else
    MINIDL_CHECK(d.step >= 0, "sample_windows: expected step >= 0, got ", d.step);
  if (!tokens.device().is_cpu()) return sample_windows_device(tokens.device())(tokens, seq, d, x, y);
  const int64_t step = d.step_on_device.defined() ? d.step_on_device.contiguous().data<int64_t>()[0] : d.step;
  const Philox rng(d.seed, d.stream);
  const uint64_t range = uint64_t(tokens.numel() - seq);
  const int32_t* t = tokens.data<int32_t>();
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t start =
        kernels::window_start(rng, uint64_t(step), uint64_t(d.global_batch), uint64_t(d.begin + r), range);
    for (int64_t i = 0; i < seq; ++i) {
      px[r * seq + i] = t[start + i];
      py[r * seq + i] = t[start + i + 1];
    }
  }
}

}  // namespace minidl::ops
