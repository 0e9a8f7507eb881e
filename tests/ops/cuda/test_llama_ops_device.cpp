// Llama's fused ops on device tensors (ops/cuda/tensor/rmsnorm.cpp, rope.cpp, swiglu.cpp), run by the emulated
// backend, against the same ops on the CPU, in f32, bf16 and f16 storage (read by the kernels directly), at widths
// around the warp and not a multiple of any vector length. Tolerances: RoPE bit for bit (the same f32 products
// and adds in the same order, ops/kernels/rope.h); RMS norm 1e-5 in f32 (the device sums squares in f32, the CPU
// in f64) and one 16-bit rounding otherwise (an f32 difference can cross a rounding boundary); SwiGLU 1e-6 in f32
// (expf against the CPU's vector exp, both within 2 ulp) and one 16-bit rounding otherwise.
#include <algorithm>
#include <cmath>

#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

double max_abs(const Values& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// x of size 2, and of size 4e-3 (mean(x^2) ~1.6e-5, where eps = 1e-5 moves rstd by a quarter). 16-bit y: besides
// the tolerance, at most 1 element in 100 may differ in its bits from the CPU's (an f32 rstd a few ulp apart can
// cross a rounding boundary); multiplying the weight before the cast changes about a third of them.
TEST_F(CudaTensorOps, RMSNormMatchesTheCpu) {
  for (DType dt : kDtypes)
    for (double scale : {2.0, 4e-3})
      for (const Shape& shape : {Shape{5, 1}, Shape{3, 4, 33}, Shape{17, 100}, Shape{9, 384}, Shape{1100, 33}}) {
        const std::string name =
            std::string(dtype_name(dt)) + " " + shape_name(shape) + " x of size " + std::to_string(scale);
        const int64_t C = shape[shape.size() - 1];
        const Tensor x = random_tensor(shape, 1, dt, scale), dy = random_tensor(shape, 2, dt);
        const Tensor w = random_tensor({C}, 3, DType::f32);
        const ops::RMSNormForward want = ops::rmsnorm_forward(x, w, 1e-5);
        const ops::RMSNormForward got = ops::rmsnorm_forward(x.to(kCuda), w.to(kCuda), 1e-5);
        expect_device_matches(got.y, want.y, rtol_for(dt), "y " + name);
        expect_device_matches(got.rstd, want.rstd, 1e-5, "rstd " + name);
        const Values got_y = got.y.to(Device::cpu()).to_vector(), want_y = want.y.to_vector();
        int64_t differ = 0;
        for (size_t i = 0; i < want_y.size(); ++i) differ += got_y[i] != want_y[i];
        if (dt != DType::f32) { EXPECT_LE(differ, int64_t(want_y.size()) / 100 + 1) << "y " << name; }
        const ops::RMSNormBackward want_grad = ops::rmsnorm_backward(dy, x, w, want.rstd);
        const ops::RMSNormBackward grad = ops::rmsnorm_backward(dy.to(kCuda), x.to(kCuda), w.to(kCuda), got.rstd);
        // dx is a difference of terms of size rstd |dy w| (exactly 0 for C = 1, where both sides leave rounding
        // noise): the tolerance is relative to that size, not to dx's.
        const Values got_dx = grad.dx.to(Device::cpu()).to_vector(), want_dx = want_grad.dx.to_vector();
        const double dx_scale = max_abs(want.rstd.to_vector()) * max_abs(dy.to_vector()) * max_abs(w.to_vector());
        for (size_t i = 0; i < want_dx.size(); ++i)
          ASSERT_NEAR(got_dx[i], want_dx[i], rtol_for(dt) * dx_scale) << "dx " << name << " element " << i;
        expect_device_matches(grad.dweight, want_grad.dweight, dt == DType::f32 ? 1e-5 : 1e-3, "dweight " + name);
      }
}

TEST_F(CudaTensorOps, RopeIsTheCpusBitsAtAnOffset) {
  const ops::RopeScaling llama3{ops::RopeType::kLlama3, 8.0, 1.0, 4.0, 16};
  for (DType dt : kDtypes)
    for (const Shape& shape : {Shape{2, 5, 3, 10}, Shape{1, 7, 2, 64}, Shape{3, 1, 9, 2}}) {
      const std::string name = std::string(dtype_name(dt)) + " " + shape_name(shape);
      const ops::RopeTables t = ops::rope_tables(40, shape[3], 1e4, llama3);
      const Tensor c = t.cos.to(kCuda), s = t.sin.to(kCuda), x = random_tensor(shape, 4, dt);
      for (int64_t offset : {int64_t(0), int64_t(29)}) {
        expect_device_matches(ops::rope_forward(x.to(kCuda), c, s, offset), ops::rope_forward(x, t.cos, t.sin, offset),
                              0, "rope " + name);
        expect_device_matches(ops::rope_backward(x.to(kCuda), c, s, offset),
                              ops::rope_backward(x, t.cos, t.sin, offset), 0, "rope_backward " + name);
      }
    }
}

TEST_F(CudaTensorOps, SwiGLUMatchesTheCpu) {
  for (DType dt : kDtypes)
    for (const Shape& shape : {Shape{1}, Shape{3, 33}, Shape{8, 96}, Shape{1001}}) {
      const std::string name = std::string(dtype_name(dt)) + " " + shape_name(shape);
      const Tensor g = random_tensor(shape, 5, dt, 6.0), u = random_tensor(shape, 6, dt),
                   dy = random_tensor(shape, 7, dt);
      const double rtol = dt == DType::f32 ? 1e-6 : rtol_for(dt);
      expect_device_matches(ops::swiglu_forward(g.to(kCuda), u.to(kCuda)), ops::swiglu_forward(g, u), rtol,
                            "y " + name);
      const ops::SwiGLUBackward want = ops::swiglu_backward(dy, g, u);
      const ops::SwiGLUBackward got = ops::swiglu_backward(dy.to(kCuda), g.to(kCuda), u.to(kCuda));
      expect_device_matches(got.dgate, want.dgate, rtol, "dgate " + name);
      expect_device_matches(got.dup, want.dup, rtol, "dup " + name);
    }
}

}  // namespace
}  // namespace minidl::testing
