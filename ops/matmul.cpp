#include "ops/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops {

namespace {

// Below this many flops a product runs as one BLAS call: splitting costs more than the work.
constexpr double kSplitMinFlops = 1 << 21;
// Per-thread blocks are multiples of this many rows (columns), so each block stays whole micro-kernel tiles.
constexpr int64_t kBlockAlign = 16;

CBLAS_TRANSPOSE flag(bool t) { return t ? CblasTrans : CblasNoTrans; }

// count_blas: nanoseconds and FLOPs of the calls below, added up by every thread that makes one.
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_blas_ns{0}, g_blas_flops{0};

template <class Call>
void counted(int64_t M, int64_t N, int64_t K, const Call& call) {
  if (!g_counting.load(std::memory_order_relaxed)) return call();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
  g_blas_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  g_blas_flops.fetch_add(2 * M * N * K, std::memory_order_relaxed);
}

CpuGemm g_cpu_gemm = CpuGemm::kAuto;

// Whether f32 products with beta 0 or 1 go to minidl's own kernel (simd::gemm_sum) rather than OpenBLAS: on
// AVX2 and AVX-512, where it is as fast or faster at a GPT's shapes (ops/cpu/simd/tile_gemm.cpp); set_cpu_gemm in
// matmul.h.
bool own_gemm() {
  if (g_cpu_gemm != CpuGemm::kAuto) return g_cpu_gemm == CpuGemm::kMinidl;
  return simd::current_isa() != simd::CpuIsa::kSse4;
}

// bias (optional): C[r, c] = bias[c] first, on the thread that computes that block of C, right before its BLAS
// call (beta = 1 then adds the product to it): a linear layer's output, written once by one thread, where a
// broadcast before the product had run on the calling thread alone while the others waited, and left the others'
// blocks in its cache. minidl's kernel takes the bias itself (gemm below).
template <class T>
void fill_bias(T* C, int64_t ldc, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const T* bias) {
  if (bias)
    for (int64_t r = r0; r < r1; ++r) std::copy(bias + c0, bias + c1, C + r * ldc + c0);
}

// One product of minidl's kernel (simd::gemm_sum's arguments but M and N): C = op(A) op(B) over K, from the bias,
// C (beta 1) or 0 (beta 0), with BLAS's transpose flags turned into element strides.
struct OwnProduct {
  int64_t K;
  const float* A;
  int64_t a_row, a_col;
  const float* B;
  int64_t b_row, b_col;
  bool accumulate;
  float* C;
  int64_t ldc;
  const float* bias;
};

OwnProduct own_product(bool ta, bool tb, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                       float beta, float* C, int64_t ldc, const float* bias) {
  return {K, A, ta ? 1 : lda, ta ? lda : 1, B, tb ? 1 : ldb, tb ? ldb : 1, beta == 1.0f && !bias, C, ldc, bias};
}

void run_own(int64_t M, int64_t N, const OwnProduct& p) {
  simd::gemm_sum(M, N, p.K, p.A, p.a_row, p.a_col, p.B, p.b_row, p.b_col, p.accumulate, p.C, p.ldc, p.bias);
}

// Row-major GEMM: C = op(A) op(B) + beta C, with op(A): (M, K), op(B): (K, N). bias (optional, with beta = 1): C's
// rows are the bias first. minidl's kernel starts its sums from the bias itself (the same bits, without a pass
// writing it into C and one reading it back: 18 MB per baby step); for BLAS it is written into C first.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float beta, float* C, int64_t ldc, const float* bias = nullptr) {
  const bool own = (beta == 0.0f || beta == 1.0f) && own_gemm();
  if (!own) fill_bias(C, ldc, 0, M, 0, N, bias);
  counted(M, N, K, [&] {
    if (own)
      run_own(M, N, own_product(ta, tb, K, A, lda, B, ldb, beta, C, ldc, bias));
    else
      cblas_sgemm(CblasRowMajor, flag(ta), flag(tb), int(M), int(N), int(K), 1.0f, A, int(lda), B, int(ldb), beta, C,
                  int(ldc));
  });
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B, int64_t ldb,
          double beta, double* C, int64_t ldc, const double* bias = nullptr) {
  fill_bias(C, ldc, 0, M, 0, N, bias);
  counted(M, N, K, [&] {
    cblas_dgemm(CblasRowMajor, flag(ta), flag(tb), int(M), int(N), int(K), 1.0, A, int(lda), B, int(ldb), beta, C,
                int(ldc));
  });
}

// A 2-D product on all threads, each calling the single-threaded kernel (minidl's or BLAS) on its share; no
// operand is copied (a block of rows of op(A) is an offset into A, a block of the reduction an offset into both).
//   - Usually the larger output dimension is cut into one block per thread; with minidl's kernel, rows are cut
//     into pieces that the threads claim, over one copy of B that they share (gemm_shared, below).
//   - When the reduction is the longest dimension (the weight gradient X^T . dY, reduced over B*T rows), each
//     thread multiplies its share of the reduction into a partial product and the partials are summed: with
//     OpenBLAS one share per thread, with minidl's kernel two fixed halves (gemm_halves, below).
// Measured on 2 cores (OpenBLAS 0.3.21 OpenMP, f32, best of 60, GFLOP/s; one thread gives ~125):
//   M x K x N              output split   partials + sum   OpenBLAS threading
//   768 x 128 x 384            243              -                238
//   768 x 384 x 128 (B^T)      240              -                233
//   128 x 768 x 384 (A^T)      221             237               230
//   2048 x 384 x 1152          243              -                243
// Splitting ourselves is never slower and a few percent faster on the small shapes, where OpenBLAS's finer
// split and its synchronisation do not amortise; for the reduction-dominated weight gradient, partial
// products beat splitting its small output (each thread then streams half of X and dY once).

// Rows [r0, r1) of C += each of `count` partial products (M x N, contiguous, one after another), in order.
template <class T>
void add_partials(T* C, int64_t ldc, const T* parts, int count, int64_t M, int64_t N, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int p = 0; p < count; ++p) {
      const T* part = parts + p * M * N + r * N;
      for (int64_t c = 0; c < N; ++c) C[r * ldc + c] += part[c];
    }
}

// colsum[j] += op(B)'s column j summed over its K rows in order, for columns [j0, j1) (B row-major, row stride ldb):
// ops::sum(B, 0)'s bits, a linear layer's bias gradient.
void add_column_sums(const float* B, int64_t K, int64_t ldb, float* colsum, int64_t j0, int64_t j1) {
  if (j0 < j1) simd::add_rows(B + j0, K, ldb, colsum + j0, j1 - j0);
}

// Products of M x N (each its own K) with minidl's kernel on all threads, where each thread is not handed a fixed
// block but claims pieces of rows, so a thread that finishes early takes work from one that is behind:
//   - Each chunk of a product's B (nc columns, kc values of k: simd::gemm_blocking) is copied into panels once, the
//     threads splitting the panels, into a buffer all of them read; where each thread called gemm_sum on a fixed
//     block, every thread copied all of B (the forward's W^T through Transpose: 2.5% of a baby step).
//   - Then each product's rows are cut into pieces, about 4 per thread in all; thread t owns a contiguous run of
//     them (with one product, the rows it wrote in the ops before; with two halves on 2 threads, its half), runs
//     those first, then takes the pieces other threads have not claimed yet, from the far end of their runs. Each
//     piece is claimed once, by an atomic compare-and-swap on the number of the chunk.
//   - One barrier per chunk, after its copy. The copies alternate between two buffers: chunk c + 1's copy goes
//     where chunk c - 1's was, which every thread has finished reading before it reached chunk c's barrier. And a
//     thread reaches chunk c + 1's barrier only when done with its rows of chunk c, so the chunks of k of the same
//     columns run in order, and every element of C is the same running sum as one gemm_sum call gives: the same
//     bits for any split and any thread count. (With one buffer, a second barrier after each chunk's rows: the
//     threads' waits at gemm_shared's barriers, summed, were 1.05-1.6 ms per baby step against 0.5-0.9 ms now;
//     AVX2, 2 threads, AMD EPYC family 25 model 17.)
// Why: a 2-vCPU VM's two threads ran the fixed halves of a product at different speeds from minute to minute.
// Baby config, AVX2, 2 threads, AMD EPYC family 25 model 17: the thread that finished first waited 5-10% of the
// time spent in the fixed-block products (0.7-1.3 ms of core time per step in the row-split products, 0.5-1.6 ms
// in the weight gradients' halves).
// then (optional): run by every thread once all products are done, with its thread number and the thread count
// (gemm_halves adds its partial there, without a parallel region of its own).
void gemm_shared(int64_t M, int64_t N, const std::vector<OwnProduct>& products, int threads,
                 const std::function<void(int, int)>& then = nullptr) {
  const int P = int(products.size());
  int64_t max_k = 0;
  for (const OwnProduct& p : products) max_k = std::max(max_k, p.K);
  const simd::GemmBlocking g = simd::gemm_blocking(M, N, max_k, products[0].a_row);
  const int64_t kc = g.kc, nc = g.nc, width = g.width, copy = g.copy, col_chunks = (N + nc - 1) / nc;
  std::vector<int64_t> k_chunks(P);
  int64_t chunks = 0;
  for (int p = 0; p < P; ++p) {
    k_chunks[p] = (products[p].K + kc - 1) / kc;
    chunks = std::max(chunks, col_chunks * k_chunks[p]);
  }
  // Pieces: Q per product, row bounds whole register blocks.
  const int Q = std::max(1, 4 * threads / P), pieces = P * Q;
  const auto row_of = [&](int q) { return q == Q ? M : std::min(M, M * q / Q / g.rows * g.rows); };
  std::vector<std::atomic<int64_t>> claimed(static_cast<size_t>(pieces));  // the chunks each piece has been claimed for
  for (auto& c : claimed) c.store(0, std::memory_order_relaxed);
  Tensor buffers = Tensor::empty(Shape{std::min<int64_t>(2, chunks), P, copy}, DType::f32);  // chunk c's in c % 2
  float* const halves = buffers.data<float>();
  const int64_t panels_per_chunk = (nc + width - 1) / width;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int64_t c = 0; c < chunks; ++c) {
      float* const packed = halves + (c % 2) * P * copy;
      // Chunk c of product p: columns j0.., k0.. (its k chunks inside its column chunks); none past its last.
      const auto chunk_of = [&](int p, int64_t& j0, int64_t& n, int64_t& k0, int64_t& k1) {
        if (c >= col_chunks * k_chunks[p]) return false;
        j0 = c / k_chunks[p] * nc, n = std::min(nc, N - j0), k0 = c % k_chunks[p] * kc;
        k1 = std::min(products[p].K, k0 + kc);
        return true;
      };
      // The copy: the (product, panel) pairs split evenly among the threads, so with two halves on 2 threads each
      // copies its half's B, whose rows it wrote (claiming pairs as the rows are claimed made the copies read the
      // other core's rows, and a baby step slower: docs/decisions.md, "GEMM on several threads").
      const int64_t pairs = int64_t(P) * panels_per_chunk;
      for (int64_t e = pairs * t / nt, e1 = pairs * (t + 1) / nt; e < e1;) {
        const int p = int(e / panels_per_chunk);
        const int64_t p0 = e % panels_per_chunk, p1 = std::min(panels_per_chunk, p0 + (e1 - e));
        e += p1 - p0;
        int64_t j0, n, k0, k1;
        if (!chunk_of(p, j0, n, k0, k1)) continue;
        const int64_t panels = (n + width - 1) / width;
        if (p0 >= panels) continue;
        const OwnProduct& pr = products[p];
        counted(0, 0, 0, [&] {
          simd::gemm_pack(g, j0, n, k0, k1, pr.B, pr.b_row, pr.b_col, p0, std::min(p1, panels), packed + p * copy);
        });
      }
#pragma omp barrier
      const auto run = [&](int f) {
        int64_t expected = c;
        if (!claimed[size_t(f)].compare_exchange_strong(expected, c + 1, std::memory_order_relaxed)) return;
        const int p = f / Q, q = f % Q;
        int64_t j0, n, k0, k1;
        if (!chunk_of(p, j0, n, k0, k1)) return;
        const int64_t i0 = row_of(q), i1 = row_of(q + 1);
        if (i0 >= i1) return;
        const OwnProduct& pr = products[p];
        counted(i1 - i0, n, k1 - k0, [&] {
          simd::gemm_sum_chunk(g, i0, i1, j0, n, N, k0, k1, pr.A, pr.a_row, pr.a_col, packed + p * copy, pr.accumulate,
                               pr.C, pr.ldc, pr.bias);
        });
      };
      const auto first = [&](int u) { return pieces * u / nt; };
      for (int f = first(t); f < first(t + 1); ++f) run(f);
      for (int k = 1; k < nt; ++k) {
        const int u = (t + k) % nt;
        for (int f = first(u + 1) - 1; f >= first(u); --f) run(f);
      }
    }
    if (then) {
#pragma omp barrier
      then(t, nt);
    }
  }
}

// The own kernel's weight gradient (the reduction the longest dimension) in two fixed halves of the reduction,
// whatever the thread count: C (from beta C or the bias) sums the first half, a scratch partial the second, and the
// partial is added to C. Every element is then the same two running sums and one add on any number of threads, and
// at 2 threads each owns one half, whose X and dY rows it wrote in the ops before (a baby step 24.2-25.0 -> 23.7-24.3
// ms against splitting the output, AMD EPYC family 25 model 17, AVX-512), and takes rows of the other's when it is
// done first (gemm_shared). One thread runs the halves in turn: an extra pass over C, about 0.3% of a baby step.
// colsum (optional, op(B) = B untransposed): += B's column sums, in the same parallel region after the product, the
// columns split among the threads (a linear layer's bias gradient without a region and a pass of its own).
void gemm_halves(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc, const float* bias, float* colsum) {
  Tensor scratch = Tensor::empty(Shape{M, N}, DType::f32);
  float* part = scratch.data<float>();
  const int64_t kh = K / 2;
  const std::vector<OwnProduct> halves = {own_product(ta, tb, kh, A, lda, B, ldb, beta, C, ldc, bias),
                                          own_product(ta, tb, K - kh, A + (ta ? kh * lda : kh), lda,
                                                      B + (tb ? kh : kh * ldb), ldb, 0.0f, part, N, nullptr)};
  const int threads = num_threads();
  if (threads == 1 || in_parallel_region()) {
    for (const OwnProduct& h : halves) counted(M, N, h.K, [&] { run_own(M, N, h); });
    add_partials(C, ldc, part, 1, M, N, 0, M);
    if (colsum) add_column_sums(B, K, ldb, colsum, 0, N);
    return;
  }
  // The partial added in the same parallel region, its rows split evenly among the threads; then the column sums.
  gemm_shared(M, N, halves, threads, [&](int t, int nt) {
    add_partials(C, ldc, part, 1, M, N, M * t / nt, M * (t + 1) / nt);
    if (colsum) add_column_sums(B, K, ldb, colsum, N * t / nt, N * (t + 1) / nt);
  });
}

// Whether an f32 product (beta 0 or 1) runs as gemm_halves: minidl's kernel, the reduction the longest dimension
// (a weight gradient), large enough to split. gemm_2d and linear_weight_bias_grad_into both ask, so that a weight
// gradient has the same bits from either.
bool takes_halves(int64_t M, int64_t N, int64_t K) {
  const bool small = 2.0 * double(M) * double(N) * double(K) < kSplitMinFlops;
  return !small && own_gemm() && K > std::max(M, N) && K >= 2 * kBlockAlign;
}

template <class T>
void gemm_2d(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
             T beta, T* C, int64_t ldc, const T* bias = nullptr) {
  const bool small = 2.0 * double(M) * double(N) * double(K) < kSplitMinFlops;
  if constexpr (std::is_same_v<T, float>) {
    // One row against a row-major B (a generated token's products): gemm_sum's row path, on this thread.
    if (M == 1 && !tb && (beta == 0.0f || beta == 1.0f) && own_gemm())
      return gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
    if ((beta == 0.0f || beta == 1.0f) && takes_halves(M, N, K))
      return gemm_halves(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias, nullptr);
  }
  int threads = num_threads();
  if (threads == 1 || in_parallel_region() || small) {
    gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
    return;
  }
  // OpenBLAS's weight gradient: one partial product over the reduction per thread, summed (its bits depend on the
  // thread count).
  if (K > std::max(M, N) && K >= threads * kBlockAlign) {
    Tensor scratch = Tensor::empty(Shape{threads - 1, M, N}, dtype_of<T>::value);  // partials of threads 1..
    T* parts = scratch.data<T>();
#pragma omp parallel num_threads(threads)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t k0 = K * t / nt, k1 = K * (t + 1) / nt;
      T* dst = t == 0 ? C : parts + (t - 1) * M * N;
      // Only thread 0's partial starts from the bias or adds beta * C.
      gemm(ta, tb, M, N, k1 - k0, A + (ta ? k0 * lda : k0), lda, B + (tb ? k0 : k0 * ldb), ldb, t == 0 ? beta : T(0),
           dst, t == 0 ? ldc : N, t == 0 ? bias : nullptr);
#pragma omp barrier
      add_partials(C, ldc, parts, nt - 1, M, N, M * t / nt, M * (t + 1) / nt);
    }
    return;
  }
  bool split_rows = M >= N;
  int64_t extent = split_rows ? M : N;
  if (extent < threads * kBlockAlign) {
    gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (split_rows && (beta == 0.0f || beta == 1.0f) && own_gemm()) {
      gemm_shared(M, N, {own_product(ta, tb, K, A, lda, B, ldb, beta, C, ldc, bias)}, threads);
      return;
    }
  }
  int64_t per = (extent + threads - 1) / threads;
  per = (per + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
#pragma omp parallel num_threads(threads)
  {
    int64_t b0 = std::min(extent, omp_get_thread_num() * per), b1 = std::min(extent, b0 + per);
    if (b0 < b1) {
      if (split_rows) {  // rows of op(A): stored rows if A is not transposed, stored columns if it is
        gemm(ta, tb, b1 - b0, N, K, A + (ta ? b0 : b0 * lda), lda, B, ldb, beta, C + b0 * ldc, ldc, bias);
      } else {  // columns of op(B)
        gemm(ta, tb, M, b1 - b0, K, A, lda, B + (tb ? b0 * ldb : b0), ldb, beta, C + b0, ldc,
             bias ? bias + b0 : nullptr);
      }
    }
  }
}

// One operand as BLAS sees it: `count` row-major matrices `batch_stride` elements apart, leading dimension `ld`,
// transposed by BLAS if `trans`. `storage` keeps a contiguous copy alive when the tensor's layout needed one.
template <class T>
struct BlasOperand {
  const T* ptr = nullptr;
  bool trans = false;
  int64_t ld = 1;
  int64_t count = 1;
  int64_t batch_stride = 0;
  Tensor storage;
};

// Can t's leading (batch) dimensions be stepped with one stride? Sets count and stride if so.
bool batch_layout(const Tensor& t, int64_t& count, int64_t& stride) {
  count = 1;
  stride = 0;
  int64_t outer_stride = -1;  // the stride the next outer dimension must have to merge with those inside it
  for (int i = t.dim() - 3; i >= 0; --i) {
    count *= t.size(i);
    if (t.size(i) == 1) continue;
    if (outer_stride >= 0 && t.stride(i) != outer_stride) return false;
    if (outer_stride < 0) stride = t.stride(i);
    outer_stride = t.stride(i) * t.size(i);
  }
  return true;
}

// t: (..., R, C), used as op(t) with transpose flag `trans`.
template <class T>
BlasOperand<T> blas_operand(const Tensor& t, bool trans) {
  BlasOperand<T> op;
  int64_t R = t.size(-2), C = t.size(-1), sr = t.stride(-2), sc = t.stride(-1);
  if (batch_layout(t, op.count, op.batch_stride)) {
    op.ptr = t.data<T>();
    if ((sc == 1 || C == 1) && (R == 1 || sr >= std::max<int64_t>(C, 1))) {  // row-major (R, C)
      op.trans = trans;
      op.ld = R == 1 ? std::max<int64_t>(C, 1) : sr;
      return op;
    }
    if ((sr == 1 || R == 1) && (C == 1 || sc >= std::max<int64_t>(R, 1))) {  // the transpose of a row-major (C, R)
      op.trans = !trans;
      op.ld = C == 1 ? std::max<int64_t>(R, 1) : sc;
      return op;
    }
  }
  Tensor copy = t.detach().contiguous();
  op.ptr = copy.data<T>();
  op.storage = copy;
  op.trans = trans;
  op.ld = std::max<int64_t>(C, 1);
  op.batch_stride = R * C;
  return op;
}

Shape batch_dims(const Tensor& t) {
  Shape s;
  for (int i = 0; i < t.dim() - 2; ++i) s.push_back(t.size(i));
  return s;
}

// Validates a matmul and returns the output shape (..., M, N).
Shape check_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  MINIDL_CHECK(a.defined() && b.defined(), "matmul: undefined input");
  MINIDL_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: expected inputs with at least 2 dimensions, got ", a.shape(),
               " and ", b.shape());
  MINIDL_CHECK(a.device() == b.device(), "matmul: inputs are on ", a.device(), " and ", b.device());
  MINIDL_CHECK(a.dtype() == b.dtype(), "matmul: dtypes ", a.dtype(), " and ", b.dtype(), " differ");
  int64_t K = ta ? a.size(-2) : a.size(-1), Kb = tb ? b.size(-1) : b.size(-2);
  MINIDL_CHECK(K == Kb, "matmul: inner dimensions differ: a ", a.shape(), ta ? " (transposed)" : "", " has K=", K,
               ", b ", b.shape(), tb ? " (transposed)" : "", " has K=", Kb);
  Shape ba = batch_dims(a), bb = batch_dims(b);
  MINIDL_CHECK(ba == bb || a.dim() == 2 || b.dim() == 2, "matmul: batch dimensions ", ba, " of a ", a.shape(), " and ",
               bb, " of b ", b.shape(), " differ (they must match, or one input must be 2-D)");
  Shape out = a.dim() >= b.dim() ? ba : bb;
  out.push_back(ta ? a.size(-1) : a.size(-2));
  out.push_back(tb ? b.size(-2) : b.size(-1));
  return out;
}

// out (..., M, N), contiguous = op(a) op(b) + beta out. Inputs already validated. bias (N values, or null; with
// beta = 1): every row of out is set to it first, as gemm_2d's.
template <class T>
void matmul_into(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, T beta, const T* bias = nullptr) {
  int64_t M = out.size(-2), N = out.size(-1), K = ta ? a.size(-2) : a.size(-1);
  BlasOperand<T> A = blas_operand<T>(a, ta), B = blas_operand<T>(b, tb);
  if (a.dim() == 2) A.batch_stride = 0;
  if (b.dim() == 2) B.batch_stride = 0;
  int64_t batch = std::max(A.count, B.count);
  T* C = out.data<T>();
  if (out.numel() == 0) return;
  if (K == 0) {  // an empty sum: the answer is beta * out (beta is 0 or 1), or the bias
    if (bias)
      fill_bias(C, N, 0, out.numel() / N, 0, N, bias);
    else if (beta == T(0))
      out.fill_(0.0);
    return;
  }
  // b shared by a batch of row-major a: the batch is just more rows of one big product.
  if (batch > 1 && b.dim() == 2 && a.dim() > 2 && !A.trans && A.batch_stride == M * A.ld) {
    gemm_2d<T>(false, B.trans, batch * M, N, K, A.ptr, A.ld, B.ptr, B.ld, beta, C, N, bias);
    return;
  }
  auto entry = [&](int64_t i) {
    gemm(A.trans, B.trans, M, N, K, A.ptr + i * A.batch_stride, A.ld, B.ptr + i * B.batch_stride, B.ld, beta,
         C + i * M * N, N, bias);
  };
  int threads = num_threads();
  if (batch >= threads && threads > 1 && !in_parallel_region()) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < batch; ++i) entry(i);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    gemm_2d<T>(A.trans, B.trans, M, N, K, A.ptr + i * A.batch_stride, A.ld, B.ptr + i * B.batch_stride, B.ld, beta,
               C + i * M * N, N, bias);
}

}  // namespace

// 16-bit operands: exact f32 copies through sgemm (f32 accumulation), the result rounded once. Debian 12's
// OpenBLAS 0.3.21 declares cblas_sbgemm but is built without it (no such symbol in libopenblas.so). For 2-D
// operands the f32 copies are made a block of rows at a time (ops/cast.h), which keeps them small: row blocks of
// `a` map to row blocks of the result; with `a` transposed (a weight gradient X^T dY) the blocks are slices of the
// reduction, accumulated in an f32 result.
// The weight-gradient shape (a transposed, both 2-D) in f32: the sum over row blocks below, not rounded.
static Tensor matmul_half_reduce_rows_f32(const Tensor& a, const Tensor& b) {
  Tensor ac = a.contiguous(), bc = b.contiguous();
  const int64_t K = a.size(0), block = half_block_rows(a.size(1) + b.size(1));
  Tensor out = Tensor::zeros({a.size(1), b.size(1)}, DType::f32, a.device());
  for (int64_t k = 0; k < K; k += block) {
    int64_t n = std::min(block, K - k);
    matmul_into<float>(out, upcast(ac.narrow(0, k, n)), upcast(bc.narrow(0, k, n)), true, false, 1.0f);
  }
  return out;
}

static Tensor matmul_half(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (b.dim() != 2 || (trans_a && (trans_b || a.dim() != 2)))
    return cast(matmul(upcast(a), upcast(b), trans_a, trans_b), a.dtype());
  Tensor ac = a.contiguous(), bc = b.contiguous();
  if (!trans_a) {  // a (..., M, K): all leading dimensions are rows
    Tensor b32 = upcast(bc);
    int64_t K = a.size(-1), N = trans_b ? b.size(0) : b.size(1);
    Shape out_shape = a.shape();
    out_shape[out_shape.size() - 1] = N;
    Tensor rows = ac.detach().view({ac.numel() / std::max<int64_t>(K, 1), K});
    return half_by_row_blocks(rows, Shape{N}, [&](const Tensor& ab) { return matmul(ab, b32, false, trans_b); })
        .view(out_shape);
  }
  // out (M, N) = sum over row blocks k of a_k^T (M x kb) b_k (kb x N).
  return cast(matmul_half_reduce_rows_f32(ac, bc), a.dtype());
}

Tensor matmul_f32(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_matmul(a, b, trans_a, trans_b);
  if (!is_half(a.dtype())) return matmul(a, b, trans_a, trans_b);
  if (!a.device().is_cpu()) return matmul_f32_device(a.device())(a, b, trans_a, trans_b);
  if (trans_a && !trans_b && a.dim() == 2 && b.dim() == 2) return matmul_half_reduce_rows_f32(a, b);
  return matmul(upcast(a), upcast(b), trans_a, trans_b);
}

void count_blas(bool on) {
  g_counting = false;
  g_blas_ns = 0;
  g_blas_flops = 0;
  g_counting = on;
}

BlasCount blas_count() { return {double(g_blas_ns.load()) * 1e-9, double(g_blas_flops.load())}; }

void set_cpu_gemm(CpuGemm gemm) { g_cpu_gemm = gemm; }
CpuGemm cpu_gemm() { return own_gemm() ? CpuGemm::kMinidl : CpuGemm::kOpenBlas; }

static bool g_allow_tf32 = false;
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

Shape matmul_output_shape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return check_matmul(a, b, trans_a, trans_b);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Shape shape = check_matmul(a, b, trans_a, trans_b);
  if (!a.device().is_cpu()) return matmul_device(a.device())(a, b, trans_a, trans_b);
  if (is_half(a.dtype())) return matmul_half(a, b, trans_a, trans_b);
  return dispatch_float("matmul", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    matmul_into<T>(out, a, b, trans_a, trans_b, T(0));
    return out;
  });
}

void matmul_add_(Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Shape shape = check_matmul(a, b, trans_a, trans_b);
  MINIDL_CHECK(out.defined(), "matmul_add_: expected a contiguous out of shape ", shape, ", got an undefined tensor");
  MINIDL_CHECK(out.shape() == shape && out.dtype() == a.dtype() && out.device() == a.device() && out.is_contiguous(),
               "matmul_add_: expected a contiguous out of shape ", shape, ", dtype ", a.dtype(), " on ", a.device(),
               ", got shape ", out.shape(), ", dtype ", out.dtype(), " on ", out.device(),
               out.is_contiguous() ? "" : ", not contiguous");
  if (!a.device().is_cpu() || is_half(a.dtype())) return add_(out, matmul(a, b, trans_a, trans_b));
  dispatch_float("matmul_add_", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    matmul_into<T>(out, a, b, trans_a, trans_b, T(1));
  });
}

void linear_weight_bias_grad_into(Tensor& dw, Tensor& dbias, const Tensor& x2, const Tensor& dy2, bool accumulate) {
  MINIDL_CHECK(x2.defined() && dy2.defined() && dw.defined() && dbias.defined(),
               "linear_weight_bias_grad_into: undefined tensor");
  MINIDL_CHECK(x2.dim() == 2 && dy2.dim() == 2 && x2.size(0) == dy2.size(0), "linear_weight_bias_grad_into: expected ",
               "x (rows, in) and dy (rows, out) with the same rows, got x ", x2.shape(), " and dy ", dy2.shape());
  const int64_t K = x2.size(0), M = x2.size(1), N = dy2.size(1);
  const std::pair<const char*, const Tensor*> named[] = {{"x", &x2}, {"dy", &dy2}, {"dw", &dw}, {"dbias", &dbias}};
  for (const auto& [name, t] : named)
    MINIDL_CHECK(t->dtype() == DType::f32 && t->device().is_cpu(), "linear_weight_bias_grad_into: expected ", name,
                 " f32 on the CPU, got ", t->dtype(), " on ", t->device());
  MINIDL_CHECK(
      dw.shape() == Shape({M, N}) && dw.is_contiguous() && dbias.shape() == Shape({N}) && dbias.is_contiguous(),
      "linear_weight_bias_grad_into: expected a contiguous dw of shape ", Shape({M, N}), " and dbias of ", Shape({N}),
      ", got ", dw.shape(), " and ", dbias.shape());
  const Tensor x = x2.contiguous(), dy = dy2.contiguous();
  if (takes_halves(M, N, K)) {
    float* colsum = dbias.data<float>();
    std::fill(colsum, colsum + N, 0.0f);
    gemm_halves(true, false, M, N, K, x.data<float>(), M, dy.data<float>(), N, accumulate ? 1.0f : 0.0f,
                dw.data<float>(), N, nullptr, colsum);
    return;
  }
  matmul_into<float>(dw, x, dy, true, false, accumulate ? 1.0f : 0.0f);
  dbias.copy_(sum(dy, 0));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  MINIDL_CHECK(x.defined() && weight.defined(), "linear: undefined input");
  MINIDL_CHECK(x.dim() >= 1 && weight.dim() == 2, "linear: expected x (..., in) and weight (in, out), got ", x.shape(),
               " and ", weight.shape());
  MINIDL_CHECK(x.size(-1) == weight.size(0), "linear: x ", x.shape(), " has ", x.size(-1), " features but weight ",
               weight.shape(), " expects ", weight.size(0));
  int64_t in = weight.size(0), out_features = weight.size(1);
  if (bias.defined()) {
    MINIDL_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: expected bias of shape (", out_features,
                 ",), got ", bias.shape());
    MINIDL_CHECK(bias.dtype() == weight.dtype(), "linear: bias dtype ", bias.dtype(), " differs from weight dtype ",
                 weight.dtype());
  }
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  int64_t rows = 1;
  for (int i = 0; i < x.dim() - 1; ++i) rows *= x.size(i);
  Tensor x2 = x.detach().reshape(Shape{rows, in});  // copies only if x is not viewable as rows
  check_matmul(x2, weight, false, false);
  if (bias.defined())
    MINIDL_CHECK(bias.device() == x.device(), "linear: expected bias on ", x.device(), ", got ", bias.device());
  if (!x.device().is_cpu()) return linear_device(x.device())(x2, weight, bias).view(out_shape);
  if (is_half(x.dtype())) {
    Tensor w = upcast(weight), b = upcast(bias);  // the weights are small; the activations go by row blocks
    return half_by_row_blocks(x2.contiguous(), Shape{out_features}, [&](const Tensor& xb) { return linear(xb, w, b); })
        .view(out_shape);
  }
  return dispatch_float("linear", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty(Shape{x2.size(0), out_features}, x.dtype(), x.device());
    const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
    matmul_into<T>(out, x2, weight, false, false, T(bias.defined() ? 1 : 0), bias.defined() ? bc.data<T>() : nullptr);
    return out.view(out_shape);
  });
}

}  // namespace minidl::ops
