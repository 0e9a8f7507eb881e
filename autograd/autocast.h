// Autocast: mixed precision by op policy. Inside an AutocastGuard(bf16 or f16) the differentiable ops of
// autograd/functions.h cast their operands per the table below; outside, nothing changes.
//
//   { autograd::AutocastGuard amp(DType::bf16);       // forward (and backward) of one optimizer step
//     Tensor loss = model.loss(x, y);                  // matmuls in bf16; layernorm math / loss in f32
//     loss.backward(); }                               // parameters (f32 masters) get f32 gradients
//   optimizer.step();                                  // after the guard: next step casts the new weights
//
// Policy (CPU: 16-bit is storage; every kernel computes in f32 on exact f32 copies of its 16-bit operands):
//
//   | op                                   | inputs under autocast              | output          |
//   |--------------------------------------|------------------------------------|-----------------|
//   | matmul, linear (x, weight, bias)     | cast to the autocast dtype         | autocast dtype  |
//   | causal_attention                     | qkv cast to the autocast dtype     | autocast dtype  |
//   | embedding                            | f32 table, gathered in f32         | autocast dtype  |
//   | bias_gelu                            | bias cast to x's dtype             | x's dtype       |
//   | gelu, dropout, add/sub/mul/div, views| as given (16-bit runs in f32 math) | input dtype     |
//   | add/sub/mul/div of mixed dtypes      | 16-bit operand cast to f32         | f32             |
//   | layernorm (and add_layernorm)        | 16-bit x kept (saved) as is, math  | x's dtype       |
//   |                                      | in f32; weight, bias f32           |                 |
//   | softmax, sum/mean/max                | 16-bit inputs cast to f32          | f32             |
//   | cross_entropy                        | 16-bit logits read as is, f32 math | f32             |
//
// So the residual stream and every saved activation but layernorm statistics and the f32 loss inputs are 16-bit:
// activation memory halves. Gradients flow back in each tensor's own dtype; the cast of an f32 tensor returns an
// f32 gradient, so parameters (the f32 master weights the optimizer updates) always receive f32 gradients. matmul
// and linear do better for an f32 operand they cast down: its gradient comes straight from a GEMM that reads the
// 16-bit operands and writes f32 (ops::matmul_f32), never rounded to 16 bits on the way.
// Only f32 and the other 16-bit type are cast down; f64 tensors (gradient checks) are left alone.
//
// Weight cache: a leaf that requires grad (a parameter) is cast once per outermost guard and the copy reused by
// every later use in that scope — micro-batches and activation-checkpoint recomputation included. The copies are
// charged to the ledger's params tag (f32 masters + 16-bit copies = 1.5x the f32 parameter bytes while a guard
// is open) and freed when the outermost guard closes. Weights must therefore not change inside a guard: open it
// around forward/backward and step the optimizer after it closes.
//
// The state is thread-local, like grad mode; backward does not consult it (backward kernels follow the dtypes
// of the saved tensors), except checkpoint(), which restores the forward's autocast state for its recomputation.
#pragma once

#include "core/tensor.h"

namespace minidl::autograd {

// f16 or bf16 inside an AutocastGuard that turned autocast on; f32 otherwise.
DType autocast_dtype();
inline bool autocast_enabled() { return autocast_dtype() != DType::f32; }

class AutocastGuard {
 public:
  // dtype: f16 or bf16 turns autocast on for this thread, f32 turns it off (e.g. for a part that must run in full
  // precision); anything else is an error.
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};

// A differentiable cast of t to dt (t itself if it already has dtype dt); the gradient is cast back to t's dtype.
// Inside a guard, a leaf that requires grad is cast through the weight cache.
Tensor autocast_to(const Tensor& t, DType dt);

// The operand of a 16-bit op: t cast to the autocast dtype when autocast is on and t is f32, f16 or bf16;
// t otherwise.
Tensor autocast_to_half(const Tensor& t);
// The operand of an f32 op: a 16-bit t cast to f32 when autocast is on; t otherwise.
Tensor autocast_to_f32(const Tensor& t);

// Number of 16-bit weight copies in this thread's cache (tests).
int64_t autocast_cached_weights();

// ZeRO-3 owns the 16-bit copies of its gathered parameters (dist/zero3.h): inside a guard, autocast_provide makes
// `copy` (param's shape, dtype copy.dtype()) the cached cast of `param` until autocast_forget or the outermost
// guard closes, so the copy lives in memory the owner frees with the block instead of in a whole-model cache.
void autocast_provide(const Tensor& param, const Tensor& copy);
void autocast_forget(const Tensor& param, DType dt);

}  // namespace minidl::autograd
