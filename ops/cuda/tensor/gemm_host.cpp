// ops/cuda/tensor/gemm.h for the emulated CUDA backend (minidl_cuda_backend_emu only): the emulator's device
// memory is host memory, so the GEMM is OpenBLAS's sgemm on it, as cuBLAS would be on a GPU. 16-bit operands
// are multiplied as exact f32 copies with f32 accumulation and the result rounded once, as the CPU op does.
#include <cblas.h>

#include <type_traits>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_emu/graph.h"
#include "ops/cuda/tensor/gemm.h"

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
  if constexpr (std::is_same_v<H, f16>) return to_f16(v);
  else return to_bf16(v);
}

template <class H>
std::vector<float> widen(const void* p, int64_t n) {
  std::vector<float> out(size_t(n > 0 ? n : 0));
  const H* h = static_cast<const H*>(p);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = to_float(h[i]);
  return out;
}

template <class H>
void gemm_half(int64_t batch, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
               const GemmOperand& B, float beta, void* C, int64_t ldc, int64_t c_stride) {
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

void gemm(int /*device*/, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K,
          float alpha, const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc,
          int64_t c_batch_stride) {
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

// No fused epilogue here: the caller adds the bias with a second GEMM, as cuBLAS without cuBLASLt would.
bool gemm_bias(int, cudaStream_t, DType, int64_t, int64_t, int64_t, const void*, const void*, const void*, void*) {
  return false;
}

}  // namespace minidl::ops::cuda
