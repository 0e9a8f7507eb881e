// The small matrix products of flash attention's tiles (ops/cpu/attention.cpp): 64 x 64 x D and the like, a few
// hundred thousand multiply-adds each, thousands of them per step. BLAS spends most of such a call packing both
// operands into its own layout and setting up; this kernel reads them where they are. Below it, GemmSum: the
// linear layers' products on the same register blocks, in a BLAS's cache blocking.
//
// Register blocking: each step of the reduction loads two vectors of B's row k and broadcasts one element of A
// for each of six rows of C, then fuses twelve multiply-adds into twelve accumulators (6 rows x 2 vectors of C:
// 12 + 2 + 1 registers, within AVX2's 16). B's row is reused by the six rows and A's element by the two vectors,
// so the loop issues 8 loads per 12 multiply-adds, all from L1 for a tile. Rows past a multiple of 6 run 4, then
// 1 at a time, and columns past a multiple of two vectors 1 vector at a time; the columns past the last whole
// vector run in scalar code. Each element of C sums over k in order, so its value does not depend on the blocking,
// the thread count or where the tile sits.
//
// On the causal diagonal (simd.h's Triangle) the kernel leaves out what is not wanted: under kLowerOutput the
// row blocks above a column block's first column, under the reduce variants the stretch of k where op(A) is zero
// for the whole row block. About half of such a tile's multiply-adds go, less the blocks the diagonal crosses.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/simd/tile_gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/cpu/simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace minidl::ops::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kFull etc. as plain ints: HWY_EXPORT'ed functions take the same arguments on every target.
constexpr int kFull = 0, kLowerOutput = 1, kLowerReduce = 2, kUpperReduce = 3;

// The reduction range [begin, end) that rows i..i+R-1 need (simd.h's Triangle): every term outside it is 0 * B
// for all R rows.
struct Reduction {
  size_t begin, end;
};
HWY_INLINE Reduction ReductionOf(int part, size_t i, size_t R, size_t K) {
  if (part == kLowerReduce) return {0, HWY_MIN(K, i + R)};
  if (part == kUpperReduce) return {HWY_MIN(K, i), K};
  return {0, K};
}

// C[i..i+R, j..j+V*L) = alpha * sum_k A(i + r, k) B[k, j..] + beta * C (beta 0: C is not read), k over k_range.
// kStart kFromC or kFromBias: the sums start from C's values, or from bias[j..] in every row, instead (alpha and
// beta unused): GemmSum's running sums, below.
constexpr int kFromZero = 0, kFromC = 1, kFromBias = 2;
template <size_t R, size_t V, int kStart = kFromZero, class D>
HWY_INLINE void TileBlock(D d, size_t i, size_t j, Reduction k_range, float alpha, const float* A, size_t a_row,
                          size_t a_col, const float* B, size_t ldb, float beta, float* C, size_t ldc,
                          const float* bias = nullptr) {
  using Vec = hn::Vec<D>;
  const size_t L = hn::Lanes(d);
  Vec acc[R][V];
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < V; ++v)
      acc[r][v] = kStart == kFromC      ? hn::LoadU(d, C + (i + r) * ldc + j + v * L)
                  : kStart == kFromBias ? hn::LoadU(d, bias + j + v * L)
                                        : hn::Zero(d);
  const float* a = A + i * a_row + k_range.begin * a_col;
  const float* b = B + k_range.begin * ldb + j;
#pragma GCC unroll 4
  for (size_t k = k_range.begin; k < k_range.end; ++k, a += a_col, b += ldb) {
    Vec bv[V];
    for (size_t v = 0; v < V; ++v) bv[v] = hn::LoadU(d, b + v * L);
    for (size_t r = 0; r < R; ++r) {
      const Vec av = hn::Set(d, a[r * a_row]);
      for (size_t v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  const Vec va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < V; ++v) {
      float* c = C + (i + r) * ldc + j + v * L;
      if constexpr (kStart != kFromZero) {
        hn::StoreU(acc[r][v], d, c);
      } else {
        const Vec scaled = hn::Mul(acc[r][v], va);
        hn::StoreU(beta == 0.0f ? scaled : hn::MulAdd(hn::LoadU(d, c), vb, scaled), d, c);
      }
    }
}

// Rows of C per register block: 6 x 2 vectors keep 12 multiply-adds in flight where 4 x 2 kept 8 (a T = 256
// attention's forward + backward, 1 thread: AVX2 20.0 -> 19.4 ms, AVX-512 17.7-18.3 -> 17.4-17.6; the baby
// shape's one diagonal tile per head, unchanged). The rows past the last 6 go 4, then 1 at a time.
constexpr size_t kTileRows = 6;

// The first row that columns from j on are wanted for: rows before j need none of them under kLowerOutput. A
// multiple of kTileRows, so the blocks stay where they are in a full product.
HWY_INLINE size_t FirstRow(int part, size_t j, size_t M) {
  return part == kLowerOutput ? HWY_MIN(M, j) / kTileRows * kTileRows : 0;
}

template <size_t V, class D>
HWY_INLINE void TileColumns(D d, size_t M, size_t j, size_t K, int part, float alpha, const float* A, size_t a_row,
                            size_t a_col, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  size_t i = FirstRow(part, j, M);
  for (; i + kTileRows <= M; i += kTileRows)
    TileBlock<kTileRows, V>(d, i, j, ReductionOf(part, i, kTileRows, K), alpha, A, a_row, a_col, B, ldb, beta, C, ldc);
  for (; i + 4 <= M; i += 4)
    TileBlock<4, V>(d, i, j, ReductionOf(part, i, 4, K), alpha, A, a_row, a_col, B, ldb, beta, C, ldc);
  for (; i < M; ++i) TileBlock<1, V>(d, i, j, ReductionOf(part, i, 1, K), alpha, A, a_row, a_col, B, ldb, beta, C, ldc);
}

void TileGemm(size_t M, size_t N, size_t K, float alpha, const float* A, size_t a_row, size_t a_col, const float* B,
              size_t ldb, float beta, float* C, size_t ldc, int part) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  // A triangle skips work in whole column blocks: of a 64 x 64 kLowerOutput tile, blocks of 32 columns leave out
  // 25%, of 16 37.5%. So AVX-512 (L = 16) runs its triangles one vector wide: baby attention's forward + backward
  // 0.94 -> 0.84 ms (1 thread, AMD EPYC family 25 model 17). AVX2's two-vector blocks are 16 columns already;
  // one vector (8) would leave out 44% but costs more in reuse than it saves (0.93 -> 1.04 ms).
  const bool two_vectors = part == kFull || 2 * L <= 16;
  size_t j = 0;
  for (; two_vectors && j + 2 * L <= N; j += 2 * L)
    TileColumns<2>(d, M, j, K, part, alpha, A, a_row, a_col, B, ldb, beta, C, ldc);
  for (; j + L <= N; j += L) TileColumns<1>(d, M, j, K, part, alpha, A, a_row, a_col, B, ldb, beta, C, ldc);
  for (; j < N; ++j)
    for (size_t i = FirstRow(part, j, M); i < M; ++i) {
      const Reduction k_range = ReductionOf(part, i, 1, K);
      float sum = 0;
      for (size_t k = k_range.begin; k < k_range.end; ++k)
        sum = std::fma(A[i * a_row + k * a_col], B[k * ldb + j], sum);
      float* c = C + i * ldc + j;
      *c = beta == 0.0f ? alpha * sum : std::fma(*c, beta, alpha * sum);
    }
}

// GemmSum: the linear layers' products, in the loops of a BLAS (Goto's), with register blocks of 6 rows x 2
// vectors of C (4 x 3 for a transposed A), as attention's tiles (6 x 2).
//   - For each chunk of nc columns and kc values of k, B's part is copied into panels two (three) vectors wide,
//     each panel's kc rows contiguous (kc x width floats: 32 KB). For each chunk of mc rows of op(A) (mc x kc
//     floats, 96 KB, in L2), every panel meets the rows 6 (4) at a time and stays in L1 while they pass. B's copy
//     (kc x nc floats) is 256 KB, half of a Zen 2's L2.
//   - Where K is shorter than kc (the forward products, K = C = 128 in the baby config), nc is sized by K, so the
//     copy stays 256 KB: c_fc's 512 columns in one chunk rather than 4. With 2 threads each chunk ends at a barrier
//     after its copy (ops/matmul.cpp's gemm_shared), and A is read once per chunk. Baby step, forced AVX2, 2 threads,
//     AMD EPYC family 25 model 17, 12 runs each in turns: 23.05 -> 22.78 ms (median), 82.5 -> 83% of the ceiling.
//   - Why copy B: its rows are N floats apart, and at N = 512 (2 KB) a panel's rows fall into 2 of L1's 64 sets
//     (the baby config's c_fc products ran at 0.81-0.86 of OpenBLAS on AVX2 before the copy, 1.03 after).
//   - op(A) is read in place, unlike a BLAS: copying it cost more than it saved (5-7% of the weight gradient's
//     time, whose 128 rows of X^T meet only 8 panels).
//   - 6 x 2 = 12 accumulators: with B's two vectors and A's broadcast, 15 of AVX2's 16 registers. 12 multiply-adds
//     per 8 loads keep 8-10 multiply-adds in flight (latency 4-5 cycles, two per cycle), where 4 x 2 leaves none
//     to spare: the baby config's products went from 75 to 89 GFLOP/s on AVX2 and 102-105 to 112 on AVX-512,
//     before the panels.
//   - A transposed A (the weight gradient X^T dY) runs 4 x 3: there each k is a row of X, so every k brings a new
//     line of A into a block; 4-row blocks use each line 4 times, 6-row ones 2.7 times, and these lines, lda
//     floats apart, crowd a few of L1's sets (lda = 512: 2 of 64). On AVX2 that product read 0.91-0.97 of
//     OpenBLAS at 6 x 2 and 0.97-1.00 at 4 x 3; AVX-512 reads the same either way.
//   - kc: a 32 KB panel (kc 256 at 6 x 2 on AVX-512) beat 16 KB: fewer passes over C, which for nanoGPT's shapes
//     (2048 x 1536) lives in L3 or memory.
//   - The reduction loop unrolled 4 times: AVX2 106 -> 110 GFLOP/s on the baby products.
//   - A last panel narrower than the rest (N = 128 leaves 8 columns past 5 panels of 24 on AVX2, 32 past 2 of 48
//     on AVX-512) runs 12 x 1 or 6 x 2 blocks, not 4 x 1: 12 accumulators there too. The baby weight gradients
//     with N = 128 went from 0.94-0.97 of OpenBLAS to 0.98-0.99 on AVX2 and from 0.94-0.95 to 1.10 on AVX-512.
// Measured (1 thread, AMD EPYC family 25 model 17, GFLOP/s of the twelve products of a config, OpenBLAS beside):
//   baby      AVX-512 111-112 (COOPERLAKE 102-103)   AVX2 110-111 (Haswell 108-109)
//   nanoGPT   AVX-512 100-105 (COOPERLAKE 100-102)   AVX2 101-104 (Haswell 103-106)
// Every element of C is one running sum over k in order, from 0, C or the bias (the k chunks run in order and hand
// the sum on through C), so its bits depend on neither the blocking nor the threads' split of C.
constexpr size_t kGemmRows = 6, kGemmVectors = 2;

// Rows [i0, i1) of C's columns [c, c + V L) from a panel `b` (its columns from c) over its kn values of k; `bias`
// (kFromBias) starts at C's first column.
template <size_t R, size_t V, int kStart, class D>
HWY_INLINE void SumPanel(D d, size_t i0, size_t i1, size_t c, size_t kn, const float* a, size_t a_row, size_t a_col,
                         const float* b, size_t width, float* C, size_t ldc, const float* bias) {
  const Reduction k_range{0, kn};
  size_t i = i0;
  for (; i + R <= i1; i += R) {
    // The next block's lines of C, while this one runs: a linear layer's output is new memory, and its blocks'
    // stores (or loads, from C) had waited on their lines. Baby step, 1 thread, the products' rate against the
    // ceiling in turns, AMD EPYC family 25 model 17: AVX2 93 -> 95.5%, AVX-512 101 -> 103% (medians of 6-8 runs).
    if (i + 2 * R <= i1)
      for (size_t r = 0; r < R; ++r) {
        hwy::Prefetch(C + (i + R + r) * ldc + c);
        hwy::Prefetch(C + (i + R + r) * ldc + c + V * hn::Lanes(d) - 1);
      }
    TileBlock<R, V, kStart>(d, i, c, k_range, 1.0f, a, a_row, a_col, b, width, 0.0f, C, ldc, bias);
  }
  if constexpr (R > 4)
    for (; i + 4 <= i1; i += 4)
      TileBlock<4, V, kStart>(d, i, c, k_range, 1.0f, a, a_row, a_col, b, width, 0.0f, C, ldc, bias);
  for (; i < i1; ++i) TileBlock<1, V, kStart>(d, i, c, k_range, 1.0f, a, a_row, a_col, b, width, 0.0f, C, ldc, bias);
}

void Transpose(const float* src, size_t ld_src, size_t rows, size_t cols, float* dst, size_t ld_dst);

// B(k, j) = B[k b_row + j b_col] for k in [k0, k1) and N columns, into panels of `width` columns (the last padded
// with zeros), each panel's k1 - k0 rows contiguous. A transposed B (b_row = 1) is read along its stored rows, in
// Transpose's 4 x 4 blocks. (Copying a row with std::copy called memmove per 32-64 floats: 3% of a baby step.)
template <class D>
HWY_INLINE void PackB(D d, size_t k0, size_t k1, size_t N, const float* B, size_t b_row, size_t b_col, size_t width,
                      float* packed) {
  const size_t L = hn::Lanes(d), kn = k1 - k0;
  for (size_t j0 = 0; j0 < N; j0 += width, packed += kn * width) {
    const size_t w = HWY_MIN(width, N - j0);
    if (b_col != 1) {
      Transpose(B + j0 * b_col + k0 * b_row, b_col, w, kn, packed, width);
      for (size_t k = 0; k < kn; ++k) std::fill(packed + k * width + w, packed + (k + 1) * width, 0.0f);
    } else if (w == width) {
      for (size_t k = k0; k < k1; ++k)
        for (size_t v = 0; v < width; v += L)
          hn::StoreU(hn::LoadU(d, B + k * b_row + j0 + v), d, packed + (k - k0) * width + v);
    } else {
      for (size_t k = k0; k < k1; ++k) {
        float* dst = packed + (k - k0) * width;
        for (size_t c = 0; c < width; ++c) dst[c] = c < w ? B[k * b_row + j0 + c] : 0.0f;
      }
    }
  }
}

// GemmSum's cuts for a kernel of kRows x kVectors and a C of M x N (simd.h's GemmBlocking). The 4 x 3 kernel (a
// transposed A) brings a new line of A at every k, so a block's kc lines of A (64 bytes each) and its panel (kc x
// width floats) must share L1: a 32 KB panel (kc 341 on AVX2) left no room, and each of the 4 blocks that share
// those lines read them from L2 again. kc = 96 keeps both within 24 KB (AVX-512's panel 18 KB, AVX2's 9), at the
// price of more passes over C, one per chunk of k: cheap while C fits in L2, so only for a C of at most 256 KB
// (every weight gradient of the baby config; nanoGPT's, 1.7-2.4 MB, keep the 32 KB panel). Baby step, 1 thread,
// the weight gradients' GFLOP/s in turns, AMD EPYC family 25 model 17: AVX2 94.2-96.3 -> 97.3-98.9 (all products
// 94-97% -> 96-97% of the ceiling); AVX-512 98.6 -> 98.9 (102.3 -> 103.3%).
template <size_t kRows, size_t kVectors>
GemmBlocking BlockingOf(size_t M, size_t N, size_t K) {
  const size_t width = kVectors * hn::Lanes(hn::ScalableTag<float>());
  const bool short_k = kRows == 4 && M * N * sizeof(float) <= (size_t(256) << 10);
  const size_t kc = short_k ? 96 : HWY_MAX(size_t(16), 8192 / width);  // a panel: kc x width floats
  const size_t mc = HWY_MAX(kRows, 24576 / kc / kRows * kRows);        // rows of A: mc x kc floats
  const size_t kn = HWY_MIN(kc, HWY_MAX(K, size_t(1)));                // k values a chunk holds
  const size_t nc = HWY_MAX(width, 65536 / kn / width * width);        // B's copy: kn x nc floats
  return {int64_t(width), int64_t(kc), int64_t(nc), int64_t(mc), int64_t(kRows), kRows == 4, int64_t(kn * nc)};
}

// Rows [i0, i1) of C's columns [j0, j0 + n) over k in [k0, k1), from B's copy of that chunk (PackB's panels).
// The chunk starts each sum from the bias, from C or from 0 if it is the first of k and not `accumulate`; a later
// one goes on from C.
template <size_t kRows, size_t kVectors>
void SumChunk(const GemmBlocking& g, size_t i0, size_t i1, size_t j0, size_t n, size_t N, size_t k0, size_t k1,
              const float* A, size_t a_row, size_t a_col, const float* packed, bool accumulate, float* C, size_t ldc,
              const float* bias) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d), width = size_t(g.width), mc = size_t(g.mc), kn = k1 - k0;
  const size_t panels = (n + width - 1) / width;
  const int start = k0 > 0 || accumulate ? kFromC : bias ? kFromBias : kFromZero;
  const float* a = A + k0 * a_col;
  for (size_t r0 = i0; r0 < i1; r0 += mc) {
    const size_t r1 = HWY_MIN(i1, r0 + mc);
    for (size_t p = 0; p < panels; ++p) {
      const size_t j = j0 + p * width, w = HWY_MIN(width, N - j);
      const float* b = packed + p * kn * width;
      const auto columns = [&](auto vectors, size_t c) {
        // A narrower last panel keeps about 12 accumulators in a block: 6 x 2 or 12 x 1.
        constexpr size_t V = decltype(vectors)::value, R = V == kVectors ? kRows : 12 / V;
        const float* bias_j = bias ? bias + j : nullptr;
        if (start == kFromC)
          SumPanel<R, V, kFromC>(d, r0, r1, c, kn, a, a_row, a_col, b, width, C + j, ldc, bias_j);
        else if (start == kFromBias)
          SumPanel<R, V, kFromBias>(d, r0, r1, c, kn, a, a_row, a_col, b, width, C + j, ldc, bias_j);
        else
          SumPanel<R, V, kFromZero>(d, r0, r1, c, kn, a, a_row, a_col, b, width, C + j, ldc, bias_j);
      };
      if (w == width) {
        columns(std::integral_constant<size_t, kVectors>(), 0);
        continue;
      }
      size_t c = 0;
      if constexpr (kVectors > 2)
        for (; c + 2 * L <= w; c += 2 * L) columns(std::integral_constant<size_t, 2>(), c);
      for (; c + L <= w; c += L) columns(std::integral_constant<size_t, 1>(), c);
      if (c == w) continue;
      // The last columns, past a whole vector: one vector of the panel (PackB's zeros past w) into a row of
      // scratch per row of C, whose first w - c lanes go to C (a vector's loads and stores would run past C's row
      // and the bias). Each lane is the same fused running sum over k a scalar loop makes, so the bits are the
      // same; in scalar code an N = 344 (SwiGLU's 8/3 x 128 + 3) product ran at 55% of the ceiling, 90% at 352.
      const size_t tail = w - c, rows = r1 - r0;
      thread_local std::vector<float> scratch;
      scratch.assign(rows * L, 0.0f);
      for (size_t i = 0; i < rows; ++i)
        for (size_t t = 0; t < tail; ++t)
          scratch[i * L + t] = start == kFromC      ? C[(r0 + i) * ldc + j + c + t]
                               : start == kFromBias ? bias[j + c + t]
                                                    : 0.0f;
      SumPanel<12, 1, kFromC>(d, 0, rows, 0, kn, a + r0 * a_row, a_row, a_col, b + c, width, scratch.data(), L,
                              nullptr);
      for (size_t i = 0; i < rows; ++i) std::copy_n(&scratch[i * L], tail, C + (r0 + i) * ldc + j + c);
    }
  }
}

template <size_t kRows, size_t kVectors>
void GemmSumBlocked(size_t M, size_t N, size_t K, const float* A, size_t a_row, size_t a_col, const float* B,
                    size_t b_row, size_t b_col, bool accumulate, float* C, size_t ldc, const float* bias) {
  const hn::ScalableTag<float> d;
  const GemmBlocking g = BlockingOf<kRows, kVectors>(M, N, K);
  const size_t width = size_t(g.width), kc = size_t(g.kc), nc = size_t(g.nc);
  thread_local std::vector<float> packed;
  if (packed.size() < size_t(g.copy)) packed.resize(size_t(g.copy));
  for (size_t j0 = 0; j0 < N; j0 += nc) {
    const size_t n = HWY_MIN(nc, N - j0);
    for (size_t k0 = 0; k0 < K; k0 += kc) {
      const size_t k1 = HWY_MIN(K, k0 + kc);
      PackB(d, k0, k1, n, B + j0 * b_col, b_row, b_col, width, packed.data());
      SumChunk<kRows, kVectors>(g, 0, M, j0, n, N, k0, k1, A, a_row, a_col, packed.data(), accumulate, C, ldc, bias);
    }
  }
}

// Whether a product runs the 4 x 3 kernel (a transposed A; see above) or the 6 x 2 one.
HWY_INLINE bool TransposedAKernel(size_t M, size_t a_row) { return a_row == 1 && M > 1; }

// One row of op(A) against a row-major op(B) (b_col == 1): a generated token's products (nn::KVCache), where
// copying B into panels for six-row tiles costs more than the row's arithmetic. Each element is the tiles' running
// sum, from 0, C or the bias, over k in order, with the same operations (MulAdd on whole vectors, std::fma on the
// last columns): the same bits, with B read once, in place.
void RowSum(size_t N, size_t K, const float* a, size_t a_col, const float* B, size_t b_row, bool accumulate, float* C,
            const float* bias) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  size_t j = 0;
  auto start = [&](size_t at) {
    return accumulate ? hn::LoadU(d, C + at) : bias ? hn::LoadU(d, bias + at) : hn::Zero(d);
  };
  for (; j + 4 * L <= N; j += 4 * L) {
    auto c0 = start(j), c1 = start(j + L), c2 = start(j + 2 * L), c3 = start(j + 3 * L);
    for (size_t k = 0; k < K; ++k) {
      const auto av = hn::Set(d, a[k * a_col]);
      const float* b = B + k * b_row + j;
      c0 = hn::MulAdd(av, hn::LoadU(d, b), c0);
      c1 = hn::MulAdd(av, hn::LoadU(d, b + L), c1);
      c2 = hn::MulAdd(av, hn::LoadU(d, b + 2 * L), c2);
      c3 = hn::MulAdd(av, hn::LoadU(d, b + 3 * L), c3);
    }
    hn::StoreU(c0, d, C + j);
    hn::StoreU(c1, d, C + j + L);
    hn::StoreU(c2, d, C + j + 2 * L);
    hn::StoreU(c3, d, C + j + 3 * L);
  }
  for (; j + L <= N; j += L) {
    auto c = start(j);
    for (size_t k = 0; k < K; ++k) c = hn::MulAdd(hn::Set(d, a[k * a_col]), hn::LoadU(d, B + k * b_row + j), c);
    hn::StoreU(c, d, C + j);
  }
  for (; j < N; ++j) {  // the last columns, past a whole vector
    float sum = accumulate ? C[j] : bias ? bias[j] : 0.0f;
    for (size_t k = 0; k < K; ++k) sum = std::fma(a[k * a_col], B[k * b_row + j], sum);
    C[j] = sum;
  }
}

void GemmSum(size_t M, size_t N, size_t K, const float* A, size_t a_row, size_t a_col, const float* B, size_t b_row,
             size_t b_col, bool accumulate, float* C, size_t ldc, const float* bias) {
  if (K == 0) {
    for (size_t i = 0; i < M && !accumulate; ++i)
      for (size_t j = 0; j < N; ++j) C[i * ldc + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (M == 1 && b_col == 1) return RowSum(N, K, A, a_col, B, b_row, accumulate, C, bias);
  if (TransposedAKernel(M, a_row))
    GemmSumBlocked<4, 3>(M, N, K, A, a_row, a_col, B, b_row, b_col, accumulate, C, ldc, bias);
  else
    GemmSumBlocked<kGemmRows, kGemmVectors>(M, N, K, A, a_row, a_col, B, b_row, b_col, accumulate, C, ldc, bias);
}

GemmBlocking GemmBlockingFor(size_t M, size_t N, size_t K, size_t a_row) {
  return TransposedAKernel(M, a_row) ? BlockingOf<4, 3>(M, N, K) : BlockingOf<kGemmRows, kGemmVectors>(M, N, K);
}

void GemmPack(const GemmBlocking& g, size_t j0, size_t n, size_t k0, size_t k1, const float* B, size_t b_row,
              size_t b_col, size_t p0, size_t p1, float* packed) {
  const hn::ScalableTag<float> d;
  const size_t width = size_t(g.width), kn = k1 - k0, j = j0 + p0 * width;
  PackB(d, k0, k1, HWY_MIN(n - p0 * width, (p1 - p0) * width), B + j * b_col, b_row, b_col, width,
        packed + p0 * kn * width);
}

void GemmSumChunk(const GemmBlocking& g, size_t i0, size_t i1, size_t j0, size_t n, size_t N, size_t k0, size_t k1,
                  const float* A, size_t a_row, size_t a_col, const float* packed, bool accumulate, float* C,
                  size_t ldc, const float* bias) {
  if (g.transposed_a)
    SumChunk<4, 3>(g, i0, i1, j0, n, N, k0, k1, A, a_row, a_col, packed, accumulate, C, ldc, bias);
  else
    SumChunk<kGemmRows, kGemmVectors>(g, i0, i1, j0, n, N, k0, k1, A, a_row, a_col, packed, accumulate, C, ldc, bias);
}

// dst (cols x rows, row stride ld_dst) = src^T (rows x cols, row stride ld_src), in 4 x 4 blocks of 128-bit vectors
// (every x86 target has them): four loads, two rounds of four interleaves, four stores per 16 elements, where
// scalar code stores one element at a time. The edges past a multiple of 4 go element by element.
void Transpose(const float* src, size_t ld_src, size_t rows, size_t cols, float* dst, size_t ld_dst) {
  size_t r = 0;
#if HWY_TARGET != HWY_SCALAR  // the fallback target has no 128-bit vectors: all of it element by element
  const hn::FixedTag<float, 4> d;
  const hn::Repartition<double, decltype(d)> dd;  // the second round moves pairs of floats
  const auto pairs = [&](auto v) { return hn::BitCast(dd, v); };
  for (; r + 4 <= rows; r += 4) {
    const float* s = src + r * ld_src;
    size_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      const auto r0 = hn::LoadU(d, s + c), r1 = hn::LoadU(d, s + ld_src + c);
      const auto r2 = hn::LoadU(d, s + 2 * ld_src + c), r3 = hn::LoadU(d, s + 3 * ld_src + c);
      const auto lo01 = pairs(hn::InterleaveLower(d, r0, r1)), lo23 = pairs(hn::InterleaveLower(d, r2, r3));
      const auto hi01 = pairs(hn::InterleaveUpper(d, r0, r1)), hi23 = pairs(hn::InterleaveUpper(d, r2, r3));
      float* t = dst + c * ld_dst + r;
      hn::StoreU(hn::BitCast(d, hn::InterleaveLower(dd, lo01, lo23)), d, t);
      hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(dd, lo01, lo23)), d, t + ld_dst);
      hn::StoreU(hn::BitCast(d, hn::InterleaveLower(dd, hi01, hi23)), d, t + 2 * ld_dst);
      hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(dd, hi01, hi23)), d, t + 3 * ld_dst);
    }
    for (; c < cols; ++c)
      for (size_t i = 0; i < 4; ++i) dst[c * ld_dst + r + i] = s[i * ld_src + c];
  }
#endif
  for (; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace minidl::ops::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"

namespace minidl::ops::simd {

HWY_EXPORT(TileGemm);
HWY_EXPORT(GemmSum);
HWY_EXPORT(GemmBlockingFor);
HWY_EXPORT(GemmPack);
HWY_EXPORT(GemmSumChunk);
HWY_EXPORT(Transpose);
static_assert(int(Triangle::kFull) == 0 && int(Triangle::kLowerOutput) == 1 && int(Triangle::kLowerReduce) == 2 &&
              int(Triangle::kUpperReduce) == 3);

void tile_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t a_row, int64_t a_col,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, Triangle part) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(TileGemm)
  (size_t(M), size_t(N), size_t(K), alpha, A, size_t(a_row), size_t(a_col), B, size_t(ldb), beta, C, size_t(ldc),
   int(part));
}

void gemm_sum(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col, const float* B,
              int64_t b_row, int64_t b_col, bool accumulate, float* C, int64_t ldc, const float* bias) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(GemmSum)
  (size_t(M), size_t(N), size_t(K), A, size_t(a_row), size_t(a_col), B, size_t(b_row), size_t(b_col), accumulate, C,
   size_t(ldc), bias);
}

GemmBlocking gemm_blocking(int64_t M, int64_t N, int64_t K, int64_t a_row) {
  ensure_isa_selected();
  return HWY_DYNAMIC_DISPATCH(GemmBlockingFor)(size_t(M), size_t(N), size_t(K), size_t(a_row));
}

void gemm_pack(const GemmBlocking& g, int64_t j0, int64_t n, int64_t k0, int64_t k1, const float* B, int64_t b_row,
               int64_t b_col, int64_t p0, int64_t p1, float* packed) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(GemmPack)
  (g, size_t(j0), size_t(n), size_t(k0), size_t(k1), B, size_t(b_row), size_t(b_col), size_t(p0), size_t(p1), packed);
}

void gemm_sum_chunk(const GemmBlocking& g, int64_t i0, int64_t i1, int64_t j0, int64_t n, int64_t N, int64_t k0,
                    int64_t k1, const float* A, int64_t a_row, int64_t a_col, const float* packed, bool accumulate,
                    float* C, int64_t ldc, const float* bias) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(GemmSumChunk)
  (g, size_t(i0), size_t(i1), size_t(j0), size_t(n), size_t(N), size_t(k0), size_t(k1), A, size_t(a_row), size_t(a_col),
   packed, accumulate, C, size_t(ldc), bias);
}

void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  ensure_isa_selected();
  HWY_DYNAMIC_DISPATCH(Transpose)(src, size_t(ld_src), size_t(rows), size_t(cols), dst, size_t(ld_dst));
}

}  // namespace minidl::ops::simd
#endif  // HWY_ONCE
