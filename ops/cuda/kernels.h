// Host launchers of minidl's hand-written CUDA kernels (ops/cuda/*.cu), on raw device pointers.
//
// Library minidl_cuda_kernels builds them with nvcc for CMAKE_CUDA_ARCHITECTURES; minidl_cuda_kernels_emu builds
// the same sources with the host compiler against the CPU emulator of CUDA (cuda_emu/), which is how the tests
// execute them. Each computes what the CPU op named beside it computes (same ops/kernels/ math, f32 only except
// the casts and the elementwise ops), and validates nothing: the op's entry checks shapes, dtypes and devices
// first. Every launcher enqueues its kernels on `stream` and returns the first launch error (cudaSuccess when all
// launched; faults inside a kernel surface at the next synchronising call, as usual in CUDA).
//
//   float* scratch;  // cudaMalloc'd, layernorm_backward_scratch_floats(rows, C) floats
//   CUDA_CHECK(layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, scratch, rows, C, stream));
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_emu/cuda_compat.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops::cuda {

// ---- layernorm.cu: ops::layernorm_forward / layernorm_backward ----
// x, y: (rows, C) row-major; weight, bias: (C); mean, rstd: (rows), rstd = 1 / sqrt(var + eps).
cudaError_t layernorm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                              float* rstd, int64_t rows, int C, float eps, cudaStream_t stream);
// Floats of device scratch that layernorm_backward needs for its dweight/dbias partial sums.
size_t layernorm_backward_scratch_floats(int64_t rows, int C);
// dy, x, dx: (rows, C); weight, dweight, dbias: (C); mean, rstd as the forward saved them. dweight and dbias are
// overwritten (not accumulated into), with the same bits on every run and every GPU.
cudaError_t layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                               const float* rstd, float* dx, float* dweight, float* dbias, float* scratch,
                               int64_t rows, int C, cudaStream_t stream);

// ---- bias_gelu.cu: ops::bias_gelu_forward / bias_gelu_backward ----
// x, y: (rows, C); bias: (C); y = gelu(x + bias), tanh approximation (ops/kernels/gelu.h).
cudaError_t bias_gelu_forward(const float* x, const float* bias, float* y, int64_t rows, int C,
                              cudaStream_t stream);
// Floats of device scratch that bias_gelu_backward needs for its dbias partial sums.
size_t bias_gelu_backward_scratch_floats(int64_t rows, int C);
// dx = dy * gelu'(x + bias); dbias (C) = dx summed over rows, overwritten, deterministic.
cudaError_t bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, float* dbias,
                               float* scratch, int64_t rows, int C, cudaStream_t stream);

// ---- adamw.cu: ops::fused_adamw_ over many tensors at once ----
// One parameter's flat buffers of n floats each (param, m, v updated in place).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
};
// One AdamW step for every tensor of the list, in as few launches as the kernel's parameter space allows (one
// for up to 36 tensors and 320 chunks of 64 Ki elements). `constants` from kernels::adamw_constants(..., step).
cudaError_t fused_adamw(const AdamWTensor* tensors, int count, const minidl::kernels::AdamWConstants& constants,
                        cudaStream_t stream);

// ---- unscale.cu: ops::unscale_and_check_ ----
// grad (n floats) *= inv_scale in place; sets *found_inf to 1 if any result is inf or NaN, and leaves it alone
// otherwise, so one flag (zeroed by the caller) collects every gradient of a step without a host round trip.
cudaError_t unscale_and_check(float* grad, int64_t n, float inv_scale, int* found_inf, cudaStream_t stream);

// ---- cross_entropy.cu: ops::cross_entropy_forward / cross_entropy_backward ----
// logits: (rows, classes); targets: (rows) i64, each in [0, classes) or ignore_index (not checked here: the op's
// entry checks target values). Writes lse (rows), row_loss (rows; device scratch, 0 for ignored rows), *loss
// (the mean over counted rows when `mean`, else the sum; NaN for a mean over no row) and *count (rows whose target
// is not ignore_index), all on the device. The loss is added in a fixed order: the same bits on every run.
cudaError_t cross_entropy_forward(const float* logits, const int64_t* targets, float* lse, float* row_loss,
                                  float* loss, int64_t* count, int64_t rows, int64_t classes, int64_t ignore_index,
                                  bool mean, cudaStream_t stream);
// dloss: device scalar; divisor: device count from the forward for the mean, nullptr for the sum (divisor 1).
// dlogits (rows, classes) = (softmax - onehot) * dloss / divisor, zeros for ignored rows.
cudaError_t cross_entropy_backward(const float* dloss, const float* logits, const int64_t* targets,
                                   const float* lse, const int64_t* divisor, float* dlogits, int64_t rows,
                                   int64_t classes, int64_t ignore_index, cudaStream_t stream);

// ---- dropout.cu: ops::dropout (f32) ----
// y (n) = x * keep / (1 - p) with the CPU's mask (ops/kernels/dropout.h), bit for bit; backward is the same call
// on the gradient. `stream` is the Philox stream id, `cuda_stream` the CUDA stream.
cudaError_t dropout(const float* x, float* y, int64_t n, double p, uint64_t seed, uint64_t stream,
                    uint64_t offset, cudaStream_t cuda_stream);

// ---- embedding.cu: ops::embedding_forward / embedding_backward ----
// weight: (vocab, C); ids: n i64 positions, each in [0, vocab) (not checked here) -> out (n, C).
cudaError_t embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t n, int C,
                              cudaStream_t stream);
// grad_out: (n, C) -> dweight (vocab, C), overwritten. deterministic: each row adds its positions in increasing
// order (the CPU op's bits, on every run); otherwise float atomics (faster on skewed ids, last bits vary).
cudaError_t embedding_backward(const float* grad_out, const int64_t* ids, float* dweight, int64_t n,
                               int64_t vocab, int C, bool deterministic, cudaStream_t stream);

// ---- fill.cu: Tensor::fill_ on a device (core's DeviceBackend::fill) ----
// dst[0..n) = the value whose bytes are the low element_bytes (1, 2, 4 or 8) bytes of `pattern`.
cudaError_t fill_bytes(void* dst, int64_t n, int element_bytes, uint64_t pattern, cudaStream_t stream);

// ---- cast.cu: ops::cast between f32 and f16/bf16 ----
// n elements, round to nearest even to 16 bits (the CPU's bits for every non-NaN value), exact to f32.
cudaError_t cast_f32_to_f16(const float* src, __half* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_f16_to_f32(const __half* src, float* dst, int64_t n, cudaStream_t stream);
cudaError_t cast_bf16_to_f32(const __nv_bfloat16* src, float* dst, int64_t n, cudaStream_t stream);

// ---- attention.cu: ops::causal_attention_forward (f32) ----
// qkv: (B, T, 3C) as GPT-2's c_attn writes it; head dimension D = C / n_head must be 16, 32 or 64
// (cudaErrorInvalidValue otherwise). out: (B, T, C), lse: (B, n_head, T).
cudaError_t causal_attention_forward(const float* qkv, float* out, float* lse, int B, int T, int C, int n_head,
                                     cudaStream_t stream);

// ---- attention_backward.cu: ops::causal_attention_backward (f32) ----
// Floats of device scratch that causal_attention_backward needs (rowsum(dout * out) per query row and head).
size_t causal_attention_backward_scratch_floats(int B, int T, int n_head);
// dout, out: (B, T, C); lse: (B, n_head, T) from the forward -> dqkv (B, T, 3C), every element overwritten, the
// same bits on every run (no atomics). Same head dimensions as the forward.
cudaError_t causal_attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                                      float* dqkv, float* scratch, int B, int T, int C, int n_head,
                                      cudaStream_t stream);

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
cudaError_t elementwise_unary(UnaryOp op, const __half* x, __half* out, const ElementwiseLayout& layout,
                              float scalar, cudaStream_t stream);
cudaError_t elementwise_unary(UnaryOp op, const __nv_bfloat16* x, __nv_bfloat16* out,
                              const ElementwiseLayout& layout, float scalar, cudaStream_t stream);
// out = a op b (strides[0] are a's, strides[1] b's). `out` may be `a` when a is contiguous: add_ accumulates so.
cudaError_t elementwise_binary(BinaryOp op, const float* a, const float* b, float* out,
                               const ElementwiseLayout& layout, cudaStream_t stream);
cudaError_t elementwise_binary(BinaryOp op, const __half* a, const __half* b, __half* out,
                               const ElementwiseLayout& layout, cudaStream_t stream);
cudaError_t elementwise_binary(BinaryOp op, const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out,
                               const ElementwiseLayout& layout, cudaStream_t stream);

// ---- reduce.cu: ops/reduce.h (sum, mean, max over everything or one dimension; max_backward) and the sums of
// sum_to_shape ----
// Deterministic: partial results are combined in a fixed order that depends on the shape only (no atomics), so
// a reduction gives the same bits on every run and every GPU. Sums accumulate in f32.
enum class ReduceOp { kSum, kMax };
// Floats of device scratch that reduce_all needs for n elements.
size_t reduce_all_scratch_floats(int64_t n);
// *out (device) = scale * sum of x[0..n) (0 for n == 0), or the max (n >= 1; NaN wins; scale unused).
cudaError_t reduce_all(ReduceOp op, const float* x, int64_t n, float scale, float* out, float* scratch,
                       cudaStream_t stream);
// Floats of device scratch that reduce_dim needs (0 when it needs none; then scratch may be nullptr).
size_t reduce_dim_scratch_floats(ReduceOp op, int64_t outer, int64_t n, int64_t inner);
// x: contiguous (outer, n, inner), n >= 1 for kMax -> out (outer, inner) = scale * sum over n, or the max with
// `indices` (outer, inner) the position of its first occurrence along n (NaN wins, as on the CPU).
cudaError_t reduce_dim(ReduceOp op, const float* x, int64_t outer, int64_t n, int64_t inner, float scale,
                       float* out, int64_t* indices, float* scratch, cudaStream_t stream);
// grad, indices: (outer, inner) -> dx (outer, n, inner): grad at each index, 0 elsewhere (every element written).
cudaError_t max_backward(const float* grad, const int64_t* indices, float* dx, int64_t outer, int64_t n,
                         int64_t inner, cudaStream_t stream);

// ---- softmax.cu: ops::softmax_forward / softmax_backward over the last dimension ----
// x, y: (rows, V), V >= 1.
cudaError_t softmax_forward(const float* x, float* y, int64_t rows, int64_t V, cudaStream_t stream);
// dy, y, dx: (rows, V); dx = y * (dy - sum(dy * y)) per row.
cudaError_t softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t V,
                             cudaStream_t stream);

}  // namespace minidl::ops::cuda
