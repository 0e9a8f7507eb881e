// ops/cuda/tensor/gemm.h on cuBLAS (minidl_cuda_backend only). cuBLAS is column-major: a row-major C = op(A) op(B)
// is the column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their own transpose flags.
// One handle per device, created on first use, bound to the device's compute stream at each call.
#include <cublas_v2.h>

#include <mutex>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "ops/cuda/tensor/gemm.h"
#include "ops/matmul.h"

namespace minidl::ops::cuda {
namespace {

const char* cublas_name(cublasStatus_t s) { return cublasGetStatusName(s); }

#define MINIDL_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                               \
    cublasStatus_t status_ = (call);                                                                 \
    MINIDL_CHECK(status_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ", cublas_name(status_), " (", \
                 cublasGetStatusString(status_), ")");                                               \
  } while (0)

cublasHandle_t handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (int(handles.size()) <= device) handles.resize(size_t(device) + 1, nullptr);
  if (handles[size_t(device)] == nullptr) {
    minidl::cuda::DeviceGuard guard(device);
    MINIDL_CUBLAS_CHECK(cublasCreate(&handles[size_t(device)]));
  }
  return handles[size_t(device)];
}

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: MINIDL_CHECK(false, "matmul: the CUDA GEMM takes f32, f16 or bf16, got ", dtype);
  }
  return CUDA_R_32F;
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void gemm(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
          const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc, int64_t c_batch_stride) {
  if (batch == 0 || M == 0 || N == 0) return;
  cublasHandle_t h = handle(device);
  MINIDL_CUBLAS_CHECK(cublasSetStream(h, stream));
  cudaDataType_t type = data_type(dtype);
  // 16-bit operands always run on tensor cores (f32 accumulation); f32 uses TF32 only when asked.
  cublasComputeType_t compute =
      dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MINIDL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, op(B.trans), op(A.trans), int(N), int(M), int(K), &alpha, B.ptr, type, int(B.ld), B.batch_stride, A.ptr,
      type, int(A.ld), A.batch_stride, &beta, C, type, int(ldc), c_batch_stride, int(batch), compute,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace minidl::ops::cuda
