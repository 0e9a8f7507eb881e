// ops/cuda/tensor/gemm.h for the emulated CUDA backend (minidl_cuda_backend_emu only): the emulator's device
// memory is host memory, so the GEMM is OpenBLAS's sgemm on it, as cuBLAS would be on a GPU. 16-bit operands
// are multiplied as exact f32 copies with f32 accumulation and the result rounded once, as the CPU op does.
// The GELU epilogues (gemm_bias_gelu, gemm_dgelu_bgrad) and the bias gradient (gemm_wgrad_bgrad) are modelled
// too; linear's bias epilogue is not.
#include <cblas.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_emu/graph.h"
#include "ops/cuda/tensor/gemm.h"
#include "ops/kernels/gelu.h"

namespace minidl::ops::cuda {
namespace {

CBLAS_TRANSPOSE flag(bool t) { return t ? CblasTrans : CblasNoTrans; }

// Elements of a stored row-major operand whose op() is rows x cols.
int64_t stored_elems(const GemmOperand& X, int64_t rows, int64_t cols) {
  int64_t stored_rows = X.trans ? cols : rows;
  return stored_rows == 0 ? 0 : (stored_rows - 1) * X.ld + (X.trans ? rows : cols);
}

template <class H>
H narrow(float v) {
  if constexpr (std::is_same_v<H, f16>)
    return to_f16(v);
  else
    return to_bf16(v);
}

template <class H>
std::vector<float> widen(const void* p, int64_t n) {
  std::vector<float> out(size_t(n > 0 ? n : 0));
  const H* h = static_cast<const H*>(p);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = to_float(h[i]);
  return out;
}

template <class H>
void gemm_half(int64_t batch, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
               float beta, void* C, int64_t ldc, int64_t c_stride) {
  for (int64_t i = 0; i < batch; ++i) {
    std::vector<float> a = widen<H>(static_cast<const H*>(A.ptr) + i * A.batch_stride, stored_elems(A, M, K));
    std::vector<float> b = widen<H>(static_cast<const H*>(B.ptr) + i * B.batch_stride, stored_elems(B, K, N));
    H* c = static_cast<H*>(C) + i * c_stride;
    std::vector<float> out(size_t(M * N));
    if (beta != 0.0f)
      for (int64_t r = 0; r < M; ++r)
        for (int64_t j = 0; j < N; ++j) out[size_t(r * N + j)] = to_float(c[r * ldc + j]);
    cblas_sgemm(CblasRowMajor, flag(A.trans), flag(B.trans), int(M), int(N), int(K), alpha, a.data(), int(A.ld),
                b.data(), int(B.ld), beta, out.data(), int(N));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) c[r * ldc + j] = narrow<H>(out[size_t(r * N + j)]);
  }
}

}  // namespace

void gemm(int /*device*/, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
          const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc, int64_t c_batch_stride) {
  if (batch == 0 || M == 0 || N == 0) return;
  MINIDL_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
               "matmul: the CUDA GEMM takes f32, f16 or bf16, got ", dtype);
  minidl::cuda::detail::count_library_launch();  // one cuBLAS call in the real backend
  // Run now, or recorded when the stream is capturing a graph, as a cuBLAS call would be (cuda_emu/graph.h).
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(stream, [=] {
    switch (dtype) {
      case DType::f32:
        for (int64_t i = 0; i < batch; ++i)
          cblas_sgemm(CblasRowMajor, flag(A.trans), flag(B.trans), int(M), int(N), int(K), alpha,
                      static_cast<const float*>(A.ptr) + i * A.batch_stride, int(A.ld),
                      static_cast<const float*>(B.ptr) + i * B.batch_stride, int(B.ld), beta,
                      static_cast<float*>(C) + i * c_batch_stride, int(ldc));
        break;
      case DType::f16: gemm_half<f16>(batch, M, N, K, alpha, A, B, beta, C, ldc, c_batch_stride); break;
      default: gemm_half<bf16>(batch, M, N, K, alpha, A, B, beta, C, ldc, c_batch_stride); break;
    }
    return cudaSuccess;
  }));
}

void gemm_f32_out(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K,
                  float alpha, const GemmOperand& A, const GemmOperand& B, float beta, float* C, int64_t ldc,
                  int64_t c_batch_stride) {
  if (dtype == DType::f32)
    return gemm(device, stream, dtype, batch, M, N, K, alpha, A, B, beta, C, ldc, c_batch_stride);
  if (batch == 0 || M == 0 || N == 0) return;
  MINIDL_CHECK(dtype == DType::f16 || dtype == DType::bf16, "matmul: the CUDA GEMM takes f32, f16 or bf16, got ",
               dtype);
  minidl::cuda::detail::count_library_launch();
  // Recorded, not run, while the stream captures a graph: as gemm() above.
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(stream, [=] {
    for (int64_t i = 0; i < batch; ++i) {
      const void* a_ptr = static_cast<const char*>(A.ptr) + i * A.batch_stride * 2;
      const void* b_ptr = static_cast<const char*>(B.ptr) + i * B.batch_stride * 2;
      const bool f16_operands = dtype == DType::f16;
      std::vector<float> a =
          f16_operands ? widen<f16>(a_ptr, stored_elems(A, M, K)) : widen<bf16>(a_ptr, stored_elems(A, M, K));
      std::vector<float> b =
          f16_operands ? widen<f16>(b_ptr, stored_elems(B, K, N)) : widen<bf16>(b_ptr, stored_elems(B, K, N));
      cblas_sgemm(CblasRowMajor, flag(A.trans), flag(B.trans), int(M), int(N), int(K), alpha, a.data(), int(A.ld),
                  b.data(), int(B.ld), beta, C + i * c_batch_stride, int(ldc));
    }
    return cudaSuccess;
  }));
}

void load_gemm_library() {}  // OpenBLAS is linked

namespace {

float load(DType dtype, const void* p, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return to_float(static_cast<const f16*>(p)[i]);
    default: return to_float(static_cast<const bf16*>(p)[i]);
  }
}

void store(DType dtype, void* p, int64_t i, float v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::f16: static_cast<f16*>(p)[i] = to_f16(v); break;
    default: static_cast<bf16*>(p)[i] = to_bf16(v); break;
  }
}

// op(A) (M, K) op(B) (K, N) in f32, unrounded: the accumulator an epilogue sees.
std::vector<float> accumulate(DType dtype, int64_t M, int64_t N, int64_t K, const GemmOperand& A,
                              const GemmOperand& B) {
  std::vector<float> c(size_t(M * N)), a_copy, b_copy;
  const float* a = static_cast<const float*>(A.ptr);
  const float* b = static_cast<const float*>(B.ptr);
  if (dtype != DType::f32) {
    a_copy = dtype == DType::f16 ? widen<f16>(A.ptr, stored_elems(A, M, K)) : widen<bf16>(A.ptr, stored_elems(A, M, K));
    b_copy = dtype == DType::f16 ? widen<f16>(B.ptr, stored_elems(B, K, N)) : widen<bf16>(B.ptr, stored_elems(B, K, N));
    a = a_copy.data();
    b = b_copy.data();
  }
  cblas_sgemm(CblasRowMajor, flag(A.trans), flag(B.trans), int(M), int(N), int(K), 1.0f, a, int(A.ld), b, int(B.ld),
              0.0f, c.data(), int(N));
  return c;
}

// The row groups of the device kernels' deterministic column sums (bias_gelu.cu, partial_sums.h): each group of
// 32 rows summed in order, then the groups in order. The same order here gives an f32 dbias the bits of the
// unfused path's.
constexpr int64_t kRowsPerPartial = 32;

}  // namespace

// The epilogues run on the host after the f32 product, in one queued call (one cuBLASLt call on a GPU), so the
// fused path, its launch count and its fallback are what CI exercises.
bool gemm_bias_gelu(int, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
                    const void* w, const void* bias, void* out, void* aux) {
  if (rows == 0 || n == 0 || k == 0) return false;
  minidl::cuda::detail::count_library_launch();
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(stream, [=] {
    const std::vector<float> pre = accumulate(dtype, rows, n, k, {x, k, 0, false}, {w, n, 0, false});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const float v = pre[size_t(r * n + j)] + (bias ? load(dtype, bias, j) : 0.0f);
        store(dtype, aux, r * n + j, v);
        store(dtype, out, r * n + j, kernels::gelu_tanh(v));
      }
    return cudaSuccess;
  }));
  return true;
}

bool gemm_dgelu_bgrad(int, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* dy,
                      const void* w, const void* aux, void* dpre, void* dbias) {
  if (rows == 0 || n == 0 || k == 0) return false;
  minidl::cuda::detail::count_library_launch();
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(stream, [=] {
    const std::vector<float> dh = accumulate(dtype, rows, n, k, {dy, k, 0, false}, {w, k, 0, true});
    std::vector<float> total(size_t(n), 0.0f), partial(size_t(n), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        const float d = dh[size_t(r * n + j)] * kernels::gelu_tanh_grad(load(dtype, aux, r * n + j));
        store(dtype, dpre, r * n + j, d);
        partial[size_t(j)] += d;
      }
      if ((r + 1) % kRowsPerPartial == 0 || r + 1 == rows)
        for (int64_t j = 0; j < n; ++j) {
          total[size_t(j)] += partial[size_t(j)];
          partial[size_t(j)] = 0.0f;
        }
    }
    if (dbias)
      for (int64_t j = 0; j < n; ++j) store(dtype, dbias, j, total[size_t(j)]);
    return cudaSuccess;
  }));
  return true;
}

namespace {

// The column sums of dy (rows, n) in f32, in the order of the unfused path's reduction kernel (ops/cuda/reduce.cu,
// reduce_dim over dim 0 of (rows, n): outer 1, inner n), so that both give the same bits. inner > 1: the rows cut
// into `chunks` runs (column_chunks: about 512 blocks of 32 columns, at least 64 rows a run, at most 64 runs); in a
// run, thread row y of 8 sums rows y, y + 8, ..., the 8 are added in order, then the runs in order. inner == 1 (one
// column): 32 lanes sum rows l, l + 32, ..., then a shuffle butterfly (xor 16, 8, 4, 2, 1), lane 0's value.
// test_linear_bgrad checks the bits against the kernel, so a change there shows.
std::vector<float> column_sums(DType dtype, const void* dy, int64_t rows, int64_t n) {
  std::vector<float> out(size_t(n), 0.0f);
  if (n == 1) {
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      lane[l] = 0.0f;
      for (int64_t j = l; j < rows; j += 32) lane[l] += load(dtype, dy, j);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ offset];
      std::copy(next, next + 32, lane);
    }
    out[0] = lane[0];
    return out;
  }
  constexpr int64_t kTileRows = 8, kTargetBlocks = 512, kMinChunkRows = 64, kMaxChunks = 64;
  const int64_t blocks = (n + 31) / 32;
  int64_t chunks = std::min((kTargetBlocks + blocks - 1) / blocks, (rows + kMinChunkRows - 1) / kMinChunkRows);
  chunks = std::clamp<int64_t>(chunks, 1, kMaxChunks);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  std::vector<float> total(size_t(n), 0.0f), thread_rows(size_t(kTileRows * n));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * chunk_rows, end = std::min(begin + chunk_rows, rows);
    std::fill(thread_rows.begin(), thread_rows.end(), 0.0f);
    for (int64_t y = 0; y < kTileRows; ++y)
      for (int64_t j = begin + y; j < end; j += kTileRows)
        for (int64_t i = 0; i < n; ++i) thread_rows[size_t(y * n + i)] += load(dtype, dy, j * n + i);
    for (int64_t i = 0; i < n; ++i) {
      float v = thread_rows[size_t(i)];
      for (int64_t y = 1; y < kTileRows; ++y) v += thread_rows[size_t(y * n + i)];
      if (chunks == 1)
        out[size_t(i)] = v;
      else
        total[size_t(i)] += v;
    }
  }
  return chunks == 1 ? out : total;
}

}  // namespace

bool gemm_wgrad_bgrad(int, cudaStream_t stream, DType dtype, DType out_dtype, int64_t rows, int64_t k, int64_t n,
                      const void* x, const void* dy, void* dw, void* dbias) {
  if (rows == 0 || n == 0 || k == 0) return false;
  if (out_dtype != dtype && out_dtype != DType::f32) return false;
  minidl::cuda::detail::count_library_launch();
  MINIDL_CUDA_CHECK(minidl::emu::enqueue(stream, [=] {
    const std::vector<float> w = accumulate(dtype, k, n, rows, {x, k, 0, true}, {dy, n, 0, false});
    for (int64_t i = 0; i < k * n; ++i) store(out_dtype, dw, i, w[size_t(i)]);
    const std::vector<float> sums = column_sums(dtype, dy, rows, n);
    for (int64_t j = 0; j < n; ++j) store(out_dtype, dbias, j, sums[size_t(j)]);
    return cudaSuccess;
  }));
  return true;
}

// No fused bias epilogue here: the caller adds the bias with a second GEMM, as cuBLAS without cuBLASLt would.
bool gemm_bias(int, cudaStream_t, DType, int64_t, int64_t, int64_t, const void*, const void*, const void*, void*) {
  return false;
}

}  // namespace minidl::ops::cuda
