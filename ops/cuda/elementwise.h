// The host launchers of elementwise.cu on raw device pointers (library minidl_cuda_kernels, nvcc; or
// minidl_cuda_kernels_emu, the same source against the CPU emulator). Validates nothing: the op's entry checks
// shapes, dtypes and devices first. Returns the first launch error (cudaSuccess when all launched); work is enqueued
// on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"

namespace minidl::ops::cuda {

// ---- elementwise.cu: ops/elementwise.h (binary with broadcasting, scalar, unary, add_, broadcast_to) and plain
// gelu_forward / gelu_backward (ops/gelu.h) ----
// Storage f32, f16 or bf16; the math is f32 (ops/kernels/gelu.h for gelu), the result rounded once to the storage
// type, as the CPU ops compute 16-bit tensors.
constexpr int kMaxElementwiseDims = 8;
// The index space of an elementwise op: `out` is contiguous of shape sizes[0..dims); input k reads element
// (i_0, ..., i_{dims-1}) at sum_d i_d * strides[k][d] (element strides, 0 on broadcast dimensions), so views and
// broadcasts need no copy. dims == 0 is a single element.
struct ElementwiseLayout {
  int dims = 0;
  int64_t sizes[kMaxElementwiseDims] = {};
  int64_t strides[2][kMaxElementwiseDims] = {};
};
enum class UnaryOp { kCopy, kNeg, kExp, kLog, kTanh, kSqrt, kSquare, kAddScalar, kMulScalar, kGelu };
// a op b; kTanhBackward: a * (1 - b^2) (a = grad, b = tanh's output); kGeluBackward: a * gelu'(b) (a = dy, b = x).
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kTanhBackward, kGeluBackward };
// out = op(x) (strides[0] is x's); `scalar` is kAddScalar's and kMulScalar's operand, rounded to f32 as the CPU
// op rounds it to the tensor's type. `out` may be `x` when x is contiguous (in place).
cudaError_t elementwise_unary(UnaryOp op, const float* x, float* out, const ElementwiseLayout& layout, float scalar,
                              cudaStream_t stream);
cudaError_t elementwise_unary(UnaryOp op, const __half* x, __half* out, const ElementwiseLayout& layout, float scalar,
                              cudaStream_t stream);
cudaError_t elementwise_unary(UnaryOp op, const __nv_bfloat16* x, __nv_bfloat16* out, const ElementwiseLayout& layout,
                              float scalar, cudaStream_t stream);
// out = a op b (strides[0] are a's, strides[1] b's). `out` may be `a` when a is contiguous: add_ accumulates so.
cudaError_t elementwise_binary(BinaryOp op, const float* a, const float* b, float* out, const ElementwiseLayout& layout,
                               cudaStream_t stream);
cudaError_t elementwise_binary(BinaryOp op, const __half* a, const __half* b, __half* out,
                               const ElementwiseLayout& layout, cudaStream_t stream);
cudaError_t elementwise_binary(BinaryOp op, const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out,
                               const ElementwiseLayout& layout, cudaStream_t stream);

}  // namespace minidl::ops::cuda
