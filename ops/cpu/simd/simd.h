// Explicit vector code for the CPU ops' hot loops, compiled for SSE4, AVX2 and AVX-512 with Google Highway and
// dispatched at run time to the best one the CPU has (or to MINIDL_CPU_ISA: ops/cpu/simd/isa.h).
//
// Each function works on one contiguous f32 row (or a flat range) of n elements, any n including 0 and tails
// shorter than a vector; the callers in ops/cpu/*.cpp split rows across threads, so nothing here depends on the
// thread count. Results are the same on every run of one ISA; between ISAs only the sums differ (more lanes mean
// a different summation order) and SSE4 rounds a*b+c twice where AVX2/AVX-512 fuse it (docs/building.md, "CPU
// instruction sets"). exp is our ExpNonPositive (ops/cpu/simd/vec-inl.h, under 1.2 ulp): every exp here has an argument
// <= 0, so the row functions require m >= every x (a max or a logsumexp); exp(-inf) = 0, NaN in -> NaN out. GELU, and
// sums of exps that store none below AVX-512, take theirs in base 2 (Exp2NonPositive, 0.8 ulp). The f64
// paths of the ops stay scalar: they are the exact reference the tests compare with.
//
//   simd::gelu_row(x, bias, y, C);                 // y = gelu(x + bias), bias may be null
//   float m = simd::max_row(s, n);
//   float l = simd::exp_sub_sum(s, m, s, n);       // s = exp(s - m) in place, l = sum
#pragma once

#include <cstdint>

#include "core/half.h"
#include "ops/kernels/adamw.h"

namespace minidl::ops::simd {

// y = gelu_tanh(x + bias) (ops/kernels/gelu.h); bias null means 0.
void gelu_row(const float* x, const float* bias, float* y, int64_t n);
// dx = dy * gelu_tanh'(x + bias); when dbias is not null, also dbias += dx.
void gelu_backward_row(const float* dy, const float* x, const float* bias, float* dx, float* dbias, int64_t n);
// gelu_backward_row over `rows` consecutive rows of n (row stride n); dbias (if not null) adds the rows' dx in row
// order, the same bits as row by row, a few rows at a time after their dx.
void gelu_backward_rows(const float* dy, const float* x, const float* bias, float* dx, float* dbias, int64_t rows,
                        int64_t n);

// max of x (-inf for n = 0).
float max_row(const float* x, int64_t n);
// y = exp(x - m), m >= every x (y may be x; null stores nothing); returns the sum of the exps (NaN if any x - m
// is). With y null the exps are 2^(x log2 e - c) against a base-2 point c near m log2 e, scaled back in double,
// and those below 2^-124 count as about 4.7e-38, which no sum that holds an exp of max(x) - m >= -50 can see
// (ops/cpu/simd/rows.cpp, SumExp2): 1.2x the exps per second on AVX2 and AVX-512. next (optional):
// n floats to prefetch while the exps run, e.g. the caller's next row, whose first pass would otherwise wait on
// memory while the exps are compute-bound on L1-resident data.
float exp_sub_sum(const float* x, float m, float* y, int64_t n, const float* next = nullptr);
// log of the sum of exp(x), in one pass over x unless its first vectors' max is far below the row's (cross-entropy's
// forward): -inf for a row of -inf, NaN if any x is NaN or +inf; the exps as exp_sub_sum's without y.
float logsumexp_row(const float* x, int64_t n);
// y = exp(x - m) * scale, m >= every x (y may be x).
void exp_sub_scale(const float* x, float m, float scale, float* y, int64_t n);
// y *= s.
void scale_row(float* y, float s, int64_t n);
// sum a * b.
float dot_row(const float* a, const float* b, int64_t n);
// dst[i] += x[r, i] for r = 0, 1, ... rows - 1 in order (rows ld apart), i < n: a column sum with the bits of the
// scalar loop over rows.
void add_rows(const float* x, int64_t rows, int64_t ld, float* dst, int64_t n);
// dx = y * (dy - c) (dx may be dy): softmax's backward and attention's dS = P * (dP - D).
void mul_sub_row(const float* y, const float* dy, float c, float* dx, int64_t n);

// Attention's row loops over a tile of scores S (rows x cols, row stride ld) in one call each (ops/cpu/attention.cpp).
// Row r sees its first min(cols, max(0, r + diag + 1)) columns, diag being the tile's first query less its first
// key (the causal mask); each visible stretch gets the single-row function's result bit for bit, and what lies past
// it is set to 0 where the function writes.
//   causal_rows_max:     max[r] = max_row of row r's visible scores.
//   causal_rows_exp:     S = exp(S - m[r]) (exp_sub_sum's, in place), 0 past; sum[r] = their sum if sum is not null.
//   causal_rows_mul_sub: dP = P * (dP - c[r]) (mul_sub_row's), 0 past.
void causal_rows_max(const float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, float* max);
void causal_rows_exp(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const float* m, float* sum);
void causal_rows_mul_sub(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag,
                         const float* c);
// out[r] = dot_row(a + r lda, b + r ldb, n) for r < rows.
void dot_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t n, float* out);
// Row r of y (row stride ld) *= s[r], as scale_row.
void scale_rows(float* y, int64_t ld, int64_t rows, int64_t n, const float* s);
// The part of a tile product that a causal attention tile on the diagonal needs (ops/cpu/attention.cpp): its
// probabilities P and score gradients dS are lower-triangular (query i sees keys j <= i), so about half of each
// product is known to be zero or not wanted.
//   kFull: all of C;
//   kLowerOutput: row i of C at columns j <= i; the others may or may not be written (S = Q K^T, dP = dO V^T);
//   kLowerReduce: row i sums over k <= i only, op(A)(i, k) being 0 beyond (O += P V, dQ += dS K);
//   kUpperReduce: row i sums over k >= i only, op(A)(i, k) being 0 before (dV += P^T dO, dK += dS^T Q).
// The reduce variants leave out terms 0 * B and sum the others in the same order: for finite B, C is kFull's, bit
// for bit.
enum class Triangle { kFull, kLowerOutput, kLowerReduce, kUpperReduce };

// C (M x N, row stride ldc) = alpha * op(A) B + beta * C for attention's tiles (ops/cpu/simd/tile_gemm.cpp): op(A)'s
// element (i, k) is A[i * a_row + k * a_col] (A: a_row = lda, a_col = 1; A^T: a_row = 1, a_col = lda), B is
// row-major K x N with row stride ldb. beta = 0 does not read C.
void tile_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t a_row, int64_t a_col,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, Triangle part = Triangle::kFull);

// C (M x N, row stride ldc) = op(A) op(B), or C + op(A) op(B) if `accumulate`, or bias + op(A) op(B) with
// `bias` (N values; not with accumulate): the f32 matrix products of the linear layers (ops/matmul.cpp). op(A)'s
// element (i, k) is A[i * a_row + k * a_col], op(B)'s (k, j) B[k * b_row + j * b_col]. Each element of C is one
// running sum, from 0, C or the bias, over k in order, so its bits do not depend on how C is cut into blocks or
// among threads (and a bias gives the bits of writing it into C first and accumulating).
void gemm_sum(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col, const float* B,
              int64_t b_row, int64_t b_col, bool accumulate, float* C, int64_t ldc, const float* bias = nullptr);

// gemm_sum in pieces, for callers that share one copy of B between threads (ops/matmul.cpp): the product is cut
// into chunks of nc columns and kc values of k; each chunk's part of B is copied into panels `width` columns wide
// (gemm_pack, panels [p0, p1) of the chunk, kn x width floats each, at packed + p0 kn width), and rows of C then
// take that chunk's sums from the copy (gemm_sum_chunk), in any order and on any thread, as long as the chunks of k
// of the same columns run in order. Every element of C is the same running sum as gemm_sum's: the same bits.
struct GemmBlocking {
  int64_t width, kc, nc;  // a panel's columns; k values and columns of a chunk (nc a multiple of width)
  int64_t mc, rows;       // rows of op(A) a chunk's panels meet at a time; rows of a register block
  bool transposed_a;      // the 4 x 3 kernel (op(A) = A^T)
  int64_t copy;           // floats of a chunk's copy of B: nc x min(kc, K)
};
// The cuts gemm_sum takes for a C of M x N over K whose op(A) has row stride a_row.
GemmBlocking gemm_blocking(int64_t M, int64_t N, int64_t K, int64_t a_row);
// Panels [p0, p1) of the chunk of columns [j0, j0 + n) and k in [k0, k1).
void gemm_pack(const GemmBlocking& g, int64_t j0, int64_t n, int64_t k0, int64_t k1, const float* B, int64_t b_row,
               int64_t b_col, int64_t p0, int64_t p1, float* packed);
// Rows [i0, i1) of C's columns [j0, j0 + n) (of N) over k in [k0, k1), from that chunk's copy; gemm_sum's
// accumulate and bias, which only the chunk with k0 = 0 reads.
void gemm_sum_chunk(const GemmBlocking& g, int64_t i0, int64_t i1, int64_t j0, int64_t n, int64_t N, int64_t k0,
                    int64_t k1, const float* A, int64_t a_row, int64_t a_col, const float* packed, bool accumulate,
                    float* C, int64_t ldc, const float* bias);

// dst (cols x rows, row stride ld_dst) = src^T, src rows x cols with row stride ld_src: a tile's B operand when the
// product wants it transposed (K of Q K^T, V of dO V^T).
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst);

// Layer norm of one row: y = (x - mean) * rstd * w + b with statistics accumulated in double (two passes).
// next (optional): n floats to prefetch, as exp_sub_sum's.
void layernorm_forward_row(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           double eps, int64_t n, const float* next = nullptr);
// Layer norm backward of one row: dx, and dw += dy * xhat, db += dy. dsum (optional): dx += dsum, rounded apart
// (the bits of the layer norm's dx and an add after it).
void layernorm_backward_row(const float* dy, const float* x, const float* w, float mean, float rstd, float* dx,
                            float* dw, float* db, int64_t n, const float* dsum = nullptr);

// RMS norm of one row (ops/rmsnorm.h): returns rstd = 1 / sqrt(mean(x^2) + eps), the sum of squares in double;
// y = (x * rstd) * w, or x * rstd with w null (the 16-bit path rounds that before the weight).
float rmsnorm_forward_row(const float* x, const float* w, float* y, double eps, int64_t n);
// RMS norm backward of one row: dx, and dw += dy * xhat_dw (16-bit x: xhat rounded to x's dtype), or
// dw += dy * xhat with xhat_dw null.
void rmsnorm_backward_row(const float* dy, const float* x, const float* w, float rstd, float* dx, float* dw, int64_t n,
                          const float* xhat_dw = nullptr);
// RoPE (ops/rope.h) of `heads` consecutive heads of 2 half floats at one position, whose tables' rows are cos and
// sin (half floats each); inverse: the backward's rotation by minus the angle. y must not overlap x.
void rope_rows(const float* x, const float* cos, const float* sin, float* y, int64_t heads, int64_t half, bool inverse);
// y = silu(gate) * up (ops/kernels/swiglu.h, the exp as exp_sub_sum's).
void swiglu_row(const float* gate, const float* up, float* y, int64_t n);
// dgate, dup of swiglu_row, times dy.
void swiglu_backward_row(const float* dy, const float* gate, const float* up, float* dgate, float* dup, int64_t n);

// ops/kernels/adamw.h's update, operation for operation (no fused multiply-adds: same bits on every ISA). zero_g
// (optional, g itself): set to zero once read, the optimizer's zero_grad in the same pass.
void adamw(float* p, const float* g, float* m, float* v, const minidl::kernels::AdamWConstants& c, int64_t n,
           float* zero_g = nullptr);
// g *= inv_scale; returns true if any result is inf or NaN.
bool unscale(float* g, float inv_scale, int64_t n);

// Dropout of the elements of Philox draws [first_draw, end_draw) of x (n elements in all, 8 per draw): y[i] =
// x[i] * scale if kept (16 bits >= threshold, kernels::dropout_threshold), else 0, with ops/kernels/dropout.h's
// mapping bit for bit (ops/cpu/simd/dropout.cpp).
void dropout_draws(const float* x, float* y, int64_t n, uint64_t first_draw, uint64_t end_draw, uint64_t seed,
                   uint64_t stream, uint64_t offset, uint32_t threshold, float scale);

// Conversions with core/half.h's rounding (nearest even) and results (NaN payloads aside).
void f32_to_bf16(const float* s, bf16* d, int64_t n);
void bf16_to_f32(const bf16* s, float* d, int64_t n);
void f32_to_f16(const float* s, f16* d, int64_t n);
void f16_to_f32(const f16* s, float* d, int64_t n);

}  // namespace minidl::ops::simd
