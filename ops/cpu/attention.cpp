// Flash-style causal attention on the CPU.
//
// Work is split over (batch, head) pairs with parallel_for (the backward's over (batch, kv head) pairs, each looping
// over its group's query heads, so one thread sums a kv head's gradient in one order); each pair runs
// single-threaded over tiles of kBlock queries x kBlock keys. The f32 tile products run in a register-blocked vector
// kernel (ops/cpu/simd/tile_gemm.cpp) that reads the operands in place: cblas_sgemm spent much of each 64 x 64 x D call
// packing them (forward + backward 8.3 -> 4.6 ms at B=12 T=64 C=128 H=4, 102.7 -> 72.3 ms at B=8 T=256 C=384 H=6;
// 1 thread, AVX2, bench/attention.cpp). f64, the reference, stays on BLAS. The softmax work between the products
// is vectorised too (ops/cpu/simd's max, exp and row updates for f32, a tile's rows in one call each): a tile has
// 64 x 64 exps for 64 x 64 x D multiply-adds, and with scalar expf it all took 1.5-1.8x longer. kBlock = 64
// measured faster than 32 and 128.
// On the diagonal tiles the products skip what the causal mask makes zero or unwanted (simd::Triangle): forward +
// backward 4.7 -> 3.6 ms at B=12 T=64 C=128 H=4 (one tile per head, all diagonal), 73.4 -> 66.6 ms at T=256
// (4 of 10 tiles); 1 thread, AVX2, AMD EPYC family 23.
// Nothing T x T is ever allocated: a tile of scores lives in a per-thread buffer.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/attention_blocks.h"
#include "ops/cast.h"
#include "ops/cpu/simd/simd.h"
#include "ops/kernels/softmax.h"

namespace minidl::ops {

// Row helpers over a tile: ops/cpu/simd's vector code for f32, each a row loop in one call; scalar loops (the
// reference) for f64. Row r of a tile of scores (rows x cols, row stride ld) sees its first visible(r, diag, cols)
// keys, diag being the tile's first query less its first key (simd.h's causal_rows_*).
static int64_t visible(int64_t r, int64_t diag, int64_t cols) { return std::clamp<int64_t>(r + diag + 1, 0, cols); }
// m[r] = the max of row r's visible scores.
static void rows_max(const float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, float* m) {
  simd::causal_rows_max(s, ld, rows, cols, diag, m);
}
static void rows_max(const double* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, double* m) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = visible(r, diag, cols);
    m[r] = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) m[r] = std::max(m[r], s[r * ld + j]);
  }
}
// s = exp(s - m[r]) in place on the visible scores, 0 past them; sum[r] (sum not null) = the sum of the exps.
static void rows_exp(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const float* m, float* sum) {
  simd::causal_rows_exp(s, ld, rows, cols, diag, m, sum);
}
static void rows_exp(double* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const double* m, double* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    double* row = s + r * ld;
    const int64_t n = visible(r, diag, cols);
    double total = 0;
    for (int64_t j = 0; j < n; ++j) total += (row[j] = std::exp(row[j] - m[r]));
    std::fill(row + n, row + cols, 0.0);
    if (sum) sum[r] = total;
  }
}
// dp = p * (dp - c[r]) in place on the visible scores, 0 past them.
static void rows_mul_sub(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag,
                         const float* c) {
  simd::causal_rows_mul_sub(p, dp, ld, rows, cols, diag, c);
}
static void rows_mul_sub(const double* p, double* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag,
                         const double* c) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = visible(r, diag, cols);
    for (int64_t j = 0; j < n; ++j) dp[r * ld + j] = p[r * ld + j] * (dp[r * ld + j] - c[r]);
    std::fill(dp + r * ld + n, dp + r * ld + cols, 0.0);
  }
}
// out[r] = sum of a's row r times b's, over n.
static void rows_dot(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t n, float* out) {
  simd::dot_rows(a, lda, b, ldb, rows, n, out);
}
static void rows_dot(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t rows, int64_t n, double* out) {
  for (int64_t r = 0; r < rows; ++r) {
    out[r] = 0;
    for (int64_t j = 0; j < n; ++j) out[r] += a[r * lda + j] * b[r * ldb + j];
  }
}
// y's row r *= s[r].
static void rows_scale(float* y, int64_t ld, int64_t rows, int64_t n, const float* s) {
  simd::scale_rows(y, ld, rows, n, s);
}
static void rows_scale(double* y, int64_t ld, int64_t rows, int64_t n, const double* s) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * ld + j] *= s[r];
}

// dst (cols x rows, row-major) = src^T, src rows x cols with row stride ld.
static void transpose(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  simd::transpose(src, ld, rows, cols, dst, rows);
}
static void transpose(const double* src, int64_t ld, int64_t rows, int64_t cols, double* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * ld + c];
}

// Queries and keys per tile: a 64 x 64 score tile (16 KiB in f32) and the Q, K, V, dO rows it touches stay in
// L1/L2, and each tile product is large enough for BLAS to run near its peak.
static constexpr int64_t kBlock = 64;

// Row-major C = alpha * op(A) op(B) + beta * C on strided tiles (lda etc. in elements). f32 goes to the tile kernel
// (ops/cpu/simd/tile_gemm.cpp), which reads op(A) in place and wants B row-major: a transposed B (the forward's
// keys of Q K^T, 64 x D) is first copied transposed into a per-thread buffer. The backward, whose outer loop runs
// over key blocks, transposes each block's K and V once for all its tiles instead (T 256: backward 12.3 -> 12.0 ms,
// 1 thread, AMD EPYC family 25 model 17).
// On a diagonal tile `part` says which half of the product is needed (simd::Triangle); the f64 reference computes
// all of it.
using simd::Triangle;
static void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, Triangle part = Triangle::kFull) {
  if (tb) {
    thread_local std::vector<float> bt;
    bt.resize(size_t(K * N));
    transpose(B, ldb, N, K, bt.data());
    B = bt.data();
    ldb = N;
  }
  simd::tile_gemm(M, N, K, alpha, A, ta ? 1 : lda, ta ? lda : 1, B, ldb, beta, C, ldc, part);
}
static void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc, Triangle = Triangle::kFull) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// The kv head that query head h reads: heads [g j, g j + g) share kv head j, g = H / Hkv (ops/attention.h).
static int64_t kv_head(int64_t h, int64_t group) { return h / group; }

// One (batch, query head): pointers to its first q row and its kv head's first k and v rows, and to its first row
// of the output-shaped tensors (row stride H D), with the rows' strides: (H + 2 Hkv) D for all three in the packed
// qkv, H D and Hkv D for a block's separate q and k, v. `span` is what the head attends: Tq query rows against Tk
// key rows, causal (the diagonal block, Tq = Tk, query i seeing keys 0..i) or not (every key).
template <class T, class U>
struct Head {
  T *q, *k, *v;
  U* o;
  int64_t ld_q, ld_kv, ld_o;
};
struct Span {
  int64_t Tq, Tk, D;
  bool causal;
};
template <class T, class U>
static Head<T, U> head(T* qkv, U* o, const AttentionDims& d, int64_t b, int64_t h) {
  T* base = qkv + b * d.T * d.width();
  T* k = base + d.C + kv_head(h, d.group()) * d.D;
  return {base + h * d.D, k, k + d.Hkv * d.D, o + b * d.T * d.C + h * d.D, d.width(), d.width(), d.C};
}
template <class T, class U>
static Head<T, U> block_head(T* q, T* k, T* v, U* o, const AttentionBlockDims& d, int64_t b, int64_t h) {
  const int64_t kv = b * d.Tk * d.Hkv * d.D + kv_head(h, d.H / d.Hkv) * d.D;
  return {q + b * d.Tq * d.C() + h * d.D, k + kv, v + kv, o + b * d.Tq * d.C() + h * d.D, d.C(), d.Hkv * d.D, d.C()};
}

template <class T>
static void forward_head(const Head<const T, T>& x, T* L, const Span& d, std::vector<T>& scratch) {
  const T scale = T(1) / std::sqrt(T(d.D));
  scratch.resize(size_t(kBlock * kBlock));
  T* S = scratch.data();
  kernels::OnlineSoftmax<T> rows[kBlock];
  T m[kBlock], sums[kBlock];
  for (int64_t i0 = 0; i0 < d.Tq; i0 += kBlock) {
    int64_t bq = std::min(kBlock, d.Tq - i0);
    // Key blocks up to the diagonal (causal) or all of them. Query and key blocks are aligned, so every tile row
    // sees at least one key (all of them before the diagonal, its own on it): no row's running max is ever -inf.
    // The first key block starts each row's max and writes its O rows (beta = 0): nothing to zero before it or
    // rescale in it. A tile off the diagonal sees all its keys: `diag` is then at least its width.
    const int64_t keys = d.causal ? i0 + bq : d.Tk;
    for (int64_t j0 = 0; j0 < keys; j0 += kBlock) {
      int64_t bk = std::min(kBlock, keys - j0);
      const bool diagonal = d.causal && j0 == i0, first = j0 == 0;  // on it P is lower-triangular: half left out
      const int64_t diag = d.causal ? i0 - j0 : kBlock;
      gemm(false, true, bq, bk, d.D, scale, x.q + i0 * x.ld_q, x.ld_q, x.k + j0 * x.ld_kv, x.ld_kv, T(0), S, bk,
           diagonal ? Triangle::kLowerOutput : Triangle::kFull);
      rows_max(S, bk, bq, bk, diag, m);
      for (int64_t i = 0; i < bq; ++i) {
        if (first) {
          rows[i] = {m[i], T(0)};
        } else {
          T factor = rows[i].rescale_for(m[i]);
          if (factor != T(1)) rows_scale(x.o + (i0 + i) * x.ld_o, x.ld_o, 1, d.D, &factor);
        }
        m[i] = rows[i].max;
      }
      rows_exp(S, bk, bq, bk, diag, m, sums);
      for (int64_t i = 0; i < bq; ++i) rows[i].sum += sums[i];
      gemm(false, false, bq, d.D, bk, T(1), S, bk, x.v + j0 * x.ld_kv, x.ld_kv, first ? T(0) : T(1), x.o + i0 * x.ld_o,
           x.ld_o, diagonal ? Triangle::kLowerReduce : Triangle::kFull);
    }
    for (int64_t i = 0; i < bq; ++i) {
      m[i] = T(1) / rows[i].sum;
      L[i0 + i] = rows[i].logsumexp();
    }
    rows_scale(x.o + i0 * x.ld_o, x.ld_o, bq, d.D, m);
  }
}

AttentionForward causal_attention_forward(const Tensor& qkv, int n_head, int n_kv_head) {
  AttentionDims d = check_causal_attention(qkv, n_head, n_kv_head);
  // A device runs its own kernels for every dtype (16-bit inputs on tensor cores, ops/cuda/flash_attention.h).
  if (!qkv.device().is_cpu()) return causal_attention_forward_device(qkv.device())(qkv, n_head, n_kv_head);
  if (is_half(qkv.dtype())) {  // f32 a block of sequences at a time (ops/cast.h): sequences are independent
    Tensor q = qkv.contiguous().detach();
    AttentionForward f{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                       Tensor::empty({d.B, d.H, d.T}, DType::f32, qkv.device())};
    for (int64_t b = 0, block = half_block_rows(d.T * d.width()); b < d.B; b += block) {
      int64_t n = std::min(block, d.B - b);
      AttentionForward part = causal_attention_forward(upcast(q.narrow(0, b, n)), n_head, n_kv_head);
      Tensor out = f.out.detach().narrow(0, b, n);
      cast_into(part.out, out);
      f.lse.detach().narrow(0, b, n).copy_(part.lse);
    }
    return f;
  }
  AttentionForward f{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                     Tensor::empty({d.B, d.H, d.T}, qkv.dtype(), qkv.device())};
  dispatch_float("causal_attention", qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.data<T>();
    T *po = f.out.data<T>(), *pl = f.lse.data<T>();
    parallel_for(0, d.B * d.H, 1, [&](int64_t p0, int64_t p1) {
      thread_local std::vector<T> scratch;
      for (int64_t p = p0; p < p1; ++p)
        forward_head(head(pqkv, po, d, p / d.H, p % d.H), pl + p * d.T, Span{d.T, d.T, d.D, true}, scratch);
    });
  });
  return f;
}

// Backward of one (batch, head), FlashAttention-2 style: for each key block, the query blocks at or after it.
// With P = exp(S - L) recomputed per tile and Drow = rowsum(dO * O) (equal to rowsum(P * dP), but O(D) per row
// instead of O(T)):
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - Drow),  dQ += scale dS K,  dK += scale dS^T Q.
// x.o is O and g.o is dO; the slice of dqkv this head touches (g.q, and its kv head's g.k, g.v) is written by this
// thread only. The first query head of a group writes its kv head's dK and dV (accumulate_kv false), the others add
// to them.
template <class T>
static void backward_head(const Head<const T, const T>& x, const Head<T, const T>& g, const T* L, const Span& d,
                          bool accumulate_kv, std::vector<T>& scratch) {
  const T scale = T(1) / std::sqrt(T(d.D));
  scratch.resize(size_t(2 * kBlock * kBlock + d.Tq + 2 * kBlock * d.D));
  T *P = scratch.data(), *dP = P + kBlock * kBlock, *Drow = dP + kBlock * kBlock, *kt = Drow + d.Tq;
  T* vt = kt + kBlock * d.D;
  rows_dot(g.o, g.ld_o, x.o, x.ld_o, d.Tq, d.D, Drow);
  for (int64_t j0 = 0; j0 < d.Tk; j0 += kBlock) {
    int64_t bk = std::min(kBlock, d.Tk - j0);
    transpose(x.k + j0 * x.ld_kv, x.ld_kv, bk, d.D, kt);  // the key block's K^T and V^T, once for all its tiles
    transpose(x.v + j0 * x.ld_kv, x.ld_kv, bk, d.D, vt);
    const int64_t first_i0 = d.causal ? j0 : 0;  // the query blocks that see this key block
    for (int64_t i0 = first_i0; i0 < d.Tq; i0 += kBlock) {
      int64_t bq = std::min(kBlock, d.Tq - i0);
      const T *q = x.q + i0 * x.ld_q, *k = x.k + j0 * x.ld_kv, *dO = g.o + i0 * g.ld_o;
      // On the diagonal P and dS are lower-triangular: S and dP are wanted on and below the diagonal only, and
      // the products with P or dS (or their transposes) leave out the terms where those are zero.
      const bool diagonal = d.causal && i0 == j0;
      const int64_t diag = d.causal ? i0 - j0 : kBlock;
      const Triangle lower_out = diagonal ? Triangle::kLowerOutput : Triangle::kFull;
      const Triangle lower_sum = diagonal ? Triangle::kLowerReduce : Triangle::kFull;
      const Triangle upper_sum = diagonal ? Triangle::kUpperReduce : Triangle::kFull;
      gemm(false, false, bq, bk, d.D, scale, q, x.ld_q, kt, bk, T(0), P, bk, lower_out);
      rows_exp(P, bk, bq, bk, diag, L + i0, nullptr);
      // The first tile of a key block (i0 == first_i0) of a group's first head writes its dV and dK rows, the first
      // of a query block (j0 == 0) its dQ rows; later tiles and heads add to them. So the gradients need no zeroing.
      const T first_k = i0 == first_i0 && !accumulate_kv ? T(0) : T(1), first_q = j0 == 0 ? T(0) : T(1);
      gemm(true, false, bk, d.D, bq, T(1), P, bk, dO, g.ld_o, first_k, g.v + j0 * g.ld_kv, g.ld_kv, upper_sum);
      gemm(false, false, bq, bk, d.D, T(1), dO, g.ld_o, vt, bk, T(0), dP, bk, lower_out);
      // dS = P (dP - Drow); zero where P is (dP there may not be computed).
      rows_mul_sub(P, dP, bk, bq, bk, diag, Drow + i0);
      gemm(false, false, bq, d.D, bk, scale, dP, bk, k, x.ld_kv, first_q, g.q + i0 * g.ld_q, g.ld_q, lower_sum);
      gemm(true, false, bk, d.D, bq, scale, dP, bk, q, x.ld_q, first_k, g.k + j0 * g.ld_kv, g.ld_kv, upper_sum);
    }
  }
}

// The backward reads Q, K and V, saved by the forward long before, from memory: each head's rows are a few cache
// lines every row of qkv, and the head's loads, spread among its products, wait on one line after another. So a
// thread starting a sequence first reads the sequence's whole qkv block (T rows of qkv, contiguous), one value per
// line in order: the lines come in at the speed of a sequential pass and its heads then find them in the cache.
// Baby config (B=12 T=64 C=128 H=4; a 96 KiB block), AVX2, AMD EPYC family 25 model 17: bench_attention --cold
// backward 0.78-0.81 -> 0.62-0.67 ms at 1 thread, 0.38-0.48 -> 0.33-0.42 at 2; inside the 2-thread step 373-381 ->
// 300-316 us per layer. Loading each head's own lines the same way gave 0.67-0.68 and 321-333. Where a block
// exceeds kReadAheadBytes it would push its own first lines out of L2 before its heads ran, and the heads' work is
// large enough for the wait not to matter (T=256 C=384: within 1% either way). The forward reads qkv just after
// the product that wrote it, and loading the block ahead there changed nothing in the step (155-161 us either way).
static constexpr int64_t kReadAheadBytes = 256 << 10;
template <class T>
static void load_lines(const T* p, int64_t n) {
  T sum = 0;
  for (int64_t i = 0; i < n; i += 64 / int64_t(sizeof(T))) sum += p[i];
  asm volatile("" : : "x"(sum));  // the loads are the point: keep them
}

Tensor causal_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 int n_head, int n_kv_head) {
  AttentionDims d = check_causal_attention(qkv, n_head, n_kv_head);
  check_shaped_like("causal_attention_backward", "dout", dout, Shape{d.B, d.T, d.C}, qkv);
  check_shaped_like("causal_attention_backward", "out", out, Shape{d.B, d.T, d.C}, qkv);
  if (is_half(qkv.dtype())) {  // the forward saved an f32 logsumexp for 16-bit inputs
    MINIDL_CHECK(lse.dtype() == DType::f32 && lse.device() == qkv.device() && lse.shape() == Shape({d.B, d.H, d.T}),
                 "causal_attention_backward: expected lse of dtype f32 and shape ", Shape({d.B, d.H, d.T}), " on ",
                 qkv.device(), ", got ", lse.dtype(), " ", lse.shape(), " on ", lse.device());
  } else {
    check_shaped_like("causal_attention_backward", "lse", lse, Shape{d.B, d.H, d.T}, qkv);
  }
  if (!qkv.device().is_cpu())
    return causal_attention_backward_device(qkv.device())(dout, qkv, out, lse, n_head, n_kv_head);
  if (is_half(qkv.dtype())) {
    Tensor q = qkv.contiguous().detach(), o = out.contiguous().detach(), g = dout.contiguous().detach();
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
    for (int64_t b = 0, block = half_block_rows(d.T * d.width()); b < d.B; b += block) {
      int64_t n = std::min(block, d.B - b);
      Tensor part =
          causal_attention_backward(upcast(g.narrow(0, b, n)), upcast(q.narrow(0, b, n)), upcast(o.narrow(0, b, n)),
                                    lse.detach().narrow(0, b, n), n_head, n_kv_head);
      Tensor dst = dqkv.detach().narrow(0, b, n);
      cast_into(part, dst);
    }
    return dqkv;
  }
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());  // every element written (backward_head)
  dispatch_float("causal_attention_backward", qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pqkv = qkv.data<T>(), *po = out.data<T>(), *pl = lse.data<T>(), *pdo = dout.data<T>();
    T* pd = dqkv.data<T>();
    const int64_t seq = d.T * d.width();  // one sequence's qkv values
    const bool read_ahead = seq * int64_t(sizeof(T)) <= kReadAheadBytes;
    // One task per (batch, kv head): its group's query heads, in order, are the only writers of its dK and dV.
    parallel_for(0, d.B * d.Hkv, 1, [&](int64_t p0, int64_t p1) {
      thread_local std::vector<T> scratch;
      for (int64_t p = p0; p < p1; ++p) {
        int64_t b = p / d.Hkv, j = p % d.Hkv;
        if (read_ahead && (p == p0 || j == 0)) load_lines(pqkv + b * seq, seq);
        for (int64_t h = j * d.group(); h < (j + 1) * d.group(); ++h)
          backward_head(head(pqkv, po, d, b, h), head(pd, pdo, d, b, h), pl + (b * d.H + h) * d.T,
                        Span{d.T, d.T, d.D, true}, h != j * d.group(), scratch);
      }
    });
  });
  return dqkv;
}

// ---- blocks of a sequence (ops/attention_blocks.h): the same head kernels on separate q, k, v ----

AttentionBlockDims check_attention_block(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                                         bool causal) {
  const char* op = "attention_block";
  check_float(op, "q", q);
  MINIDL_CHECK(q.device().is_cpu() || q.dtype() == DType::f32, op, ": runs in f32 on a CUDA device, got q of ",
               q.dtype(), " on ", q.device());
  MINIDL_CHECK(n_head >= 1 && n_kv_head >= 1 && n_head % n_kv_head == 0, op,
               ": expected n_head a multiple of n_kv_head, both >= 1, got ", n_head, " and ", n_kv_head);
  MINIDL_CHECK(q.dim() == 3 && q.size(2) % n_head == 0 && q.size(2) > 0, op,
               ": expected q of shape (B, Tq, n_head * head_dim) with n_head = ", n_head, ", got ", q.shape());
  const int64_t B = q.size(0), Tq = q.size(1), D = q.size(2) / n_head;
  MINIDL_CHECK(k.dim() == 3 && k.size(0) == B && k.size(2) == n_kv_head * D, op, ": expected k of shape (", B, ", Tk, ",
               n_kv_head * D, ") (n_kv_head = ", n_kv_head, ", head_dim ", D, "), got ", k.shape());
  check_shaped_like(op, "k", k, k.shape(), q);
  check_shaped_like(op, "v", v, k.shape(), q);
  const int64_t Tk = k.size(1);
  MINIDL_CHECK(Tq >= 1 && Tk >= 1, op, ": expected at least one query and one key, got Tq = ", Tq, " and Tk = ", Tk);
  MINIDL_CHECK(!causal || Tq == Tk, op, ": a causal block is a diagonal one, Tq = Tk, got Tq = ", Tq, " and Tk = ", Tk);
  return {B, Tq, Tk, n_head, D, n_kv_head};
}

AttentionForward attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                                         bool causal) {
  const AttentionBlockDims d = check_attention_block(q, k, v, n_head, n_kv_head, causal);
  if (!q.device().is_cpu())
    return attention_block_forward_device(q.device())(q.contiguous(), k.contiguous(), v.contiguous(), n_head, n_kv_head,
                                                      causal);
  AttentionForward f{Tensor::empty({d.B, d.Tq, d.C()}, q.dtype(), q.device()),
                     Tensor::empty({d.B, d.H, d.Tq}, q.dtype(), q.device())};
  dispatch_float("attention_block", q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T *po = f.out.data<T>(), *pl = f.lse.data<T>();
    const Span span{d.Tq, d.Tk, d.D, causal};
    parallel_for(0, d.B * d.H, 1, [&](int64_t p0, int64_t p1) {
      thread_local std::vector<T> scratch;
      for (int64_t p = p0; p < p1; ++p)
        forward_head(block_head(pq, pk, pv, po, d, p / d.H, p % d.H), pl + p * d.Tq, span, scratch);
    });
  });
  return f;
}

AttentionBlockGrads attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, int n_head, int n_kv_head,
                                             bool causal) {
  const AttentionBlockDims d = check_attention_block(q, k, v, n_head, n_kv_head, causal);
  const char* op = "attention_block_backward";
  check_shaped_like(op, "dout", dout, q.shape(), q);
  check_shaped_like(op, "out", out, q.shape(), q);
  check_shaped_like(op, "lse", lse, Shape{d.B, d.H, d.Tq}, q);
  if (!q.device().is_cpu())
    return attention_block_backward_device(q.device())(dout.contiguous(), q.contiguous(), k.contiguous(),
                                                       v.contiguous(), out.contiguous(), lse.contiguous(), n_head,
                                                       n_kv_head, causal);
  AttentionBlockGrads g{Tensor::empty(q.shape(), q.dtype(), q.device()),
                        Tensor::empty(k.shape(), k.dtype(), k.device()),
                        Tensor::empty(v.shape(), v.dtype(), v.device())};  // every element written (backward_head)
  dispatch_float(op, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>(), *po = out.data<T>(), *pl = lse.data<T>();
    const T* pdo = dout.data<T>();
    T *dq = g.dq.data<T>(), *dk = g.dk.data<T>(), *dv = g.dv.data<T>();
    const Span span{d.Tq, d.Tk, d.D, causal};
    const int64_t group = d.H / d.Hkv;
    parallel_for(0, d.B * d.Hkv, 1, [&](int64_t p0, int64_t p1) {  // one task per (batch, kv head), as above
      thread_local std::vector<T> scratch;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = p / d.Hkv, j = p % d.Hkv;
        for (int64_t h = j * group; h < (j + 1) * group; ++h)
          backward_head(block_head(pq, pk, pv, po, d, b, h), block_head(dq, dk, dv, pdo, d, b, h),
                        pl + (b * d.H + h) * d.Tq, span, h != j * group, scratch);
      }
    });
  });
  return g;
}

void merge_attention_blocks(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* op = "merge_attention_blocks";
  check_float(op, "out", out);
  MINIDL_CHECK(out.device().is_cpu() || out.dtype() == DType::f32, op, ": runs in f32 on a CUDA device, got out of ",
               out.dtype(), " on ", out.device());
  MINIDL_CHECK(out.dim() == 3, op, ": expected out of shape (B, T, H * head_dim), got ", out.shape());
  check_shaped_like(op, "out_b", out_b, out.shape(), out);
  MINIDL_CHECK(lse.dim() == 3 && lse.size(0) == out.size(0) && lse.size(2) == out.size(1) && lse.size(1) > 0 &&
                   out.size(2) % lse.size(1) == 0,
               op, ": expected lse of shape (B, H, T) for out of shape ", out.shape(), ", got ", lse.shape());
  check_shaped_like(op, "lse", lse, lse.shape(), out);
  check_shaped_like(op, "lse_b", lse_b, lse.shape(), out);
  const int64_t B = out.size(0), T = out.size(1), H = lse.size(1), D = out.size(2) / H;
  MINIDL_CHECK(out.is_contiguous() && lse.is_contiguous(), op, ": expected contiguous out and lse (updated in place)");
  if (!out.device().is_cpu())
    return merge_attention_blocks_device(out.device())(out, lse, out_b.contiguous(), lse_b.contiguous());
  dispatch_float(op, out.dtype(), [&](auto tag) {
    using U = decltype(tag);
    U *o = out.data<U>(), *l = lse.data<U>();
    const U *ob = out_b.data<U>(), *lb = lse_b.data<U>();
    parallel_for(0, B * H, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = p / H, h = p % H;
        for (int64_t t = 0; t < T; ++t) {
          U& a = l[p * T + t];
          const U c = lb[p * T + t];
          if (c == -std::numeric_limits<U>::infinity()) continue;  // the block saw nothing of this row
          // w = sigmoid(c - a), the block's share of the row; the new lse is log(e^a + e^c) = max + log1p(e^-|a-c|).
          const U w = a == -std::numeric_limits<U>::infinity() ? U(1) : U(1) / (U(1) + std::exp(a - c));
          U* row = o + (b * T + t) * H * D + h * D;
          const U* rb = ob + (b * T + t) * H * D + h * D;
          if (w == U(1)) {
            std::copy(rb, rb + D, row);
          } else {
            for (int64_t i = 0; i < D; ++i) row[i] -= w * (row[i] - rb[i]);
          }
          a = std::max(a, c) + std::log1p(std::exp(-std::abs(a - c)));
        }
      }
    });
  });
}

}  // namespace minidl::ops
