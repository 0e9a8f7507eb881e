// ops/cuda/tensor/gemm.h on cuBLAS (minidl_cuda_backend only). cuBLAS is column-major: a row-major C = op(A) op(B)
// is the column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their own transpose flags.
// One handle per device, created on first use, bound to the device's compute stream at each call. linear's bias
// rides in cuBLASLt's epilogue (gemm_bias) where it has an algorithm for the shape.
#include <cublasLt.h>
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

// cuBLASLt, for the bias epilogue: one handle per device, and one workspace (kLtWorkspace bytes) per device from
// the caching allocator, kept for the process's life.
constexpr size_t kLtWorkspace = size_t(4) << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

LtDevice& lt(int device) {
  static std::mutex mutex;
  static std::vector<LtDevice> devices;
  std::lock_guard<std::mutex> lock(mutex);
  if (int(devices.size()) <= device) devices.resize(size_t(device) + 1);
  LtDevice& d = devices[size_t(device)];
  if (d.handle == nullptr) {
    minidl::cuda::DeviceGuard guard(device);
    MINIDL_CUBLAS_CHECK(cublasLtCreate(&d.handle));
    d.workspace = minidl::cuda::allocate(kLtWorkspace, device);
  }
  return d;
}

// Owns the descriptors of one cublasLtMatmul call.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

// Column-major, as cuBLASLt sees row-major data: out^T (n x rows) = w^T (n x k) x^T (k x rows), and the bias is
// one value per row of out^T, which is what CUBLASLT_EPILOGUE_BIAS adds (broadcast over the columns).
bool gemm_bias(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
               const void* w, const void* bias, void* out) {
  if (rows == 0 || n == 0 || k == 0) return false;
  LtDevice& dev = lt(device);
  cudaDataType_t type = data_type(dtype);
  cublasComputeType_t compute =
      dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtCall call;
  if (cublasLtMatmulDescCreate(&call.desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return false;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  MINIDL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  MINIDL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  MINIDL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.a, type, uint64_t(n), uint64_t(k), n));     // w^T
  MINIDL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.b, type, uint64_t(k), uint64_t(rows), k));  // x^T
  MINIDL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.d, type, uint64_t(n), uint64_t(rows), n));  // out^T
  MINIDL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&call.pref));
  size_t workspace = kLtWorkspace;
  MINIDL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(dev.handle, call.desc, call.a, call.b, call.d, call.d, call.pref, 1, &heuristic,
                                     &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;  // no fused algorithm for this shape: the caller adds the bias
  const float one = 1.0f, zero = 0.0f;
  MINIDL_CUBLAS_CHECK(cublasLtMatmul(dev.handle, call.desc, &one, w, call.a, x, call.b, &zero, out, call.d, out,
                                     call.d, &heuristic.algo, dev.workspace, kLtWorkspace, stream));
  return true;
}

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
