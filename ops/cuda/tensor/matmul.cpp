// matmul and linear on CUDA devices, through the backend's GEMM (ops/cuda/tensor/gemm.h: cuBLAS, or OpenBLAS on
// the emulated device). Transposes are GEMM flags and batches one strided-batched call, never copies; an
// operand that is not contiguous is made contiguous first. linear's bias goes into the GEMM's epilogue where the
// backend offers one (cuBLASLt); otherwise it is one more GEMM of rank 1 that accumulates ones(rows) x bias into
// the output (beta = 1), so no separate broadcast kernel is needed.
#include "ops/cuda/tensor/elementwise.h"
#include "ops/cuda/tensor/gemm.h"
#include "ops/cuda/tensor/register.h"
#include "ops/matmul.h"

namespace minidl::ops::cuda {
namespace {

// A contiguous operand of a (possibly batched) product: op() of each batch entry is rows x cols.
GemmOperand operand(const Tensor& t, bool trans) {
  int64_t R = t.size(-2), C = t.size(-1);
  return {t.raw_device_data(), std::max<int64_t>(C, 1), t.dim() == 2 ? 0 : R * C, trans};
}

// The product with its output in out_dtype: the operands' dtype (matmul), or f32 (matmul_f32).
Tensor product(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb, DType out_dtype) {
  Tensor a = a_in.detach().contiguous(), b = b_in.detach().contiguous();
  Shape shape = matmul_output_shape(a, b, ta, tb);
  OnDevice on(a);
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  int64_t M = shape[shape.size() - 2], N = shape[shape.size() - 1], K = ta ? a.size(-2) : a.size(-1);
  int64_t batch = out.numel() / std::max<int64_t>(M * N, 1);
  if (out.numel() == 0) return out;
  if (K == 0) return Tensor::zeros(shape, out_dtype, a.device());
  GemmOperand A = operand(a, ta), B = operand(b, tb);
  auto run = [&](int64_t n_batch, int64_t rows, int64_t c_stride) {
    if (out_dtype == a.dtype())
      gemm(a.device().index, on.stream, a.dtype(), n_batch, rows, N, K, 1.0f, A, B, 0.0f, out.raw_device_data(), N,
           c_stride);
    else
      gemm_f32_out(a.device().index, on.stream, a.dtype(), n_batch, rows, N, K, 1.0f, A, B, 0.0f,
                   out.device_data<float>(), N, c_stride);
  };
  if (batch > 1 && b.dim() == 2 && !ta) {  // a shared b: the batch is just more rows of one product
    A.batch_stride = 0;
    run(1, batch * M, 0);
  } else {
    run(batch, M, M * N);
  }
  return out;
}

Tensor matmul_cuda(const Tensor& a, const Tensor& b, bool ta, bool tb) { return product(a, b, ta, tb, a.dtype()); }
Tensor matmul_f32_cuda(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_cuda_dtype("matmul_f32", a, /*half_too=*/true);
  return product(a, b, ta, tb, DType::f32);
}

// x2: (rows, in) contiguous-able, weight: (in, out), bias: (out) or undefined -> (rows, out).
Tensor linear_cuda(const Tensor& x2_in, const Tensor& weight_in, const Tensor& bias) {
  Tensor x2 = x2_in.detach().contiguous(), w = weight_in.detach().contiguous();
  int64_t rows = x2.size(0), in = x2.size(1), out_features = w.size(1);
  OnDevice on(x2);
  Tensor out = Tensor::empty({rows, out_features}, x2.dtype(), x2.device());
  if (out.numel() == 0) return out;
  int dev = x2.device().index;
  if (bias.defined() && in > 0) {  // the bias in the GEMM's epilogue (cuBLASLt), where the backend has one
    Tensor b = bias.detach().contiguous();
    if (gemm_bias(dev, on.stream, x2.dtype(), rows, out_features, in, x2.raw_device_data(), w.raw_device_data(),
                  b.raw_device_data(), out.raw_device_data()))
      return out;
  }
  if (in == 0) {
    out = Tensor::zeros({rows, out_features}, x2.dtype(), x2.device());
  } else {
    gemm(dev, on.stream, x2.dtype(), 1, rows, out_features, in, 1.0f, {x2.raw_device_data(), in, 0, false},
         {w.raw_device_data(), out_features, 0, false}, 0.0f, out.raw_device_data(), out_features, 0);
  }
  if (bias.defined()) {
    Tensor ones = Tensor::full({rows}, 1.0, x2.dtype(), x2.device());
    Tensor b = bias.detach().contiguous();
    gemm(dev, on.stream, x2.dtype(), 1, rows, out_features, 1, 1.0f, {ones.raw_device_data(), 1, 0, false},
         {b.raw_device_data(), out_features, 0, false}, 1.0f, out.raw_device_data(), out_features, 0);
  }
  return out;
}

void register_matmul() {
  matmul_device.set(DeviceKind::kCUDA, &matmul_cuda);
  linear_device.set(DeviceKind::kCUDA, &linear_cuda);
  matmul_f32_device.set(DeviceKind::kCUDA, &matmul_f32_cuda);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_matmul);

}  // namespace minidl::ops::cuda
