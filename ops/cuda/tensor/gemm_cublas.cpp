// ops/cuda/tensor/gemm.h on cuBLAS (minidl_cuda_backend only). cuBLAS is column-major: a row-major C = op(A) op(B)
// is the column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their own transpose flags.
// One handle per device, created on first use, bound to the device's compute stream at each call. linear's bias
// rides in cuBLASLt's epilogue (gemm_bias) where it has an algorithm for the shape, and so do the GPT MLP's bias +
// GELU and its backward (gemm_bias_gelu, gemm_dgelu_bgrad).
//
// cuBLAS and cuBLASLt are opened with dlopen at the first product on a GPU, not linked: loading libcublasLt
// touches about 150 MB (measured: a process's RSS goes from 2 to 154 MB), which every CPU-only run of a CUDA
// build of train_gpt would otherwise carry. Only the functions below are used.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "ops/cuda/tensor/gemm.h"
#include "ops/matmul.h"

namespace minidl::ops::cuda {
namespace {

// The cuBLAS/cuBLASLt entry points minidl calls, looked up by name in the libraries of the toolkit it was built
// with (libcublas.so.<major>, which pulls in libcublasLt.so.<major>).
struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasGetStatusName) GetStatusName;
  decltype(&cublasGetStatusString) GetStatusString;
  // cublas_api.h also declares a C++ overload of this name (with 64-bit sizes), so the type is spelled out.
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int, long long,
                                         int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasLtCreate) LtCreate;
  decltype(&cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) LtMatmul;
};

void* open_library(const std::string& name) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
  MINIDL_CHECK(handle != nullptr, "matmul on a CUDA device needs ", name, " (the CUDA toolkit's cuBLAS, found at ",
               "build time), and it cannot be loaded: ", dlerror());
  return handle;
}

template <class Fn>
void bind(Fn& fn, void* library, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(library, symbol));
  MINIDL_CHECK(fn != nullptr, "cuBLAS has no function ", symbol, ": ", dlerror());
}

const CublasApi& cublas() {
  static const CublasApi api = [] {
    const std::string major = std::to_string(CUBLAS_VER_MAJOR);
    void* blas = open_library("libcublas.so." + major);
    void* lt = open_library("libcublasLt.so." + major);
    CublasApi a{};
    bind(a.Create, blas, "cublasCreate_v2");
    bind(a.SetStream, blas, "cublasSetStream_v2");
    bind(a.SetWorkspace, blas, "cublasSetWorkspace_v2");
    bind(a.GetStatusName, blas, "cublasGetStatusName");
    bind(a.GetStatusString, blas, "cublasGetStatusString");
    bind(a.GemmStridedBatchedEx, blas, "cublasGemmStridedBatchedEx");
    bind(a.LtCreate, lt, "cublasLtCreate");
    bind(a.LtMatmulDescCreate, lt, "cublasLtMatmulDescCreate");
    bind(a.LtMatmulDescDestroy, lt, "cublasLtMatmulDescDestroy");
    bind(a.LtMatmulDescSetAttribute, lt, "cublasLtMatmulDescSetAttribute");
    bind(a.LtMatrixLayoutCreate, lt, "cublasLtMatrixLayoutCreate");
    bind(a.LtMatrixLayoutDestroy, lt, "cublasLtMatrixLayoutDestroy");
    bind(a.LtMatmulPreferenceCreate, lt, "cublasLtMatmulPreferenceCreate");
    bind(a.LtMatmulPreferenceDestroy, lt, "cublasLtMatmulPreferenceDestroy");
    bind(a.LtMatmulPreferenceSetAttribute, lt, "cublasLtMatmulPreferenceSetAttribute");
    bind(a.LtMatmulAlgoGetHeuristic, lt, "cublasLtMatmulAlgoGetHeuristic");
    bind(a.LtMatmul, lt, "cublasLtMatmul");
    return a;
  }();
  return api;
}

#define MINIDL_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                        \
    cublasStatus_t status_ = (call);                                                                          \
    MINIDL_CHECK(status_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ", cublas().GetStatusName(status_), " (", \
                 cublas().GetStatusString(status_), ")");                                                     \
  } while (0)

// cuBLAS's handle for `device`, bound to `stream` with the device's own workspace. Without a workspace of ours,
// cuBLAS takes one from its own pool, and none while a CUDA graph is being captured: a product captured into a graph
// could then run another algorithm than the same product run eagerly, and graph replay, or a recomputed forward, would
// differ from the eager step in its last bits. So the workspace is pinned, as PyTorch pins it: allocated once per
// device from the caching allocator (32 MiB on Hopper and later, 4 MiB before, cuBLAS's recommended sizes) and set
// after every cublasSetStream, which resets it to the default pool.
cublasHandle_t handle(int device, cudaStream_t stream) {
  struct Device {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
  };
  static std::mutex mutex;
  static std::vector<Device> devices;
  std::lock_guard<std::mutex> lock(mutex);
  if (int(devices.size()) <= device) devices.resize(size_t(device) + 1);
  Device& d = devices[size_t(device)];
  if (d.handle == nullptr) {
    minidl::cuda::DeviceGuard guard(device);
    int major = 0;
    MINIDL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    d.workspace_bytes = size_t(major >= 9 ? 32 : 4) << 20;
    d.workspace = minidl::cuda::allocate(d.workspace_bytes, device);
    MINIDL_CUBLAS_CHECK(cublas().Create(&d.handle));
  }
  MINIDL_CUBLAS_CHECK(cublas().SetStream(d.handle, stream));
  MINIDL_CUBLAS_CHECK(cublas().SetWorkspace(d.handle, d.workspace, d.workspace_bytes));
  return d.handle;
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

// cuBLASLt, for the epilogues: one handle per device, and one workspace (kLtWorkspace bytes) per device from
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
    MINIDL_CUBLAS_CHECK(cublas().LtCreate(&d.handle));
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
    if (pref) cublas().LtMatmulPreferenceDestroy(pref);
    if (d) cublas().LtMatrixLayoutDestroy(d);
    if (b) cublas().LtMatrixLayoutDestroy(b);
    if (a) cublas().LtMatrixLayoutDestroy(a);
    if (desc) cublas().LtMatmulDescDestroy(desc);
  }
};

// cuBLASLt's heuristic costs microseconds of host time per query, and a training step asks for the same few
// shapes every time: its answer is cached per (device, epilogue, operand layout, shape, dtypes, compute type,
// pointer alignments).
struct LtKey {
  int device;
  cublasLtEpilogue_t epilogue;
  DType dtype, out_dtype;
  cublasComputeType_t compute;
  bool trans_a, trans_b;
  int64_t m, n, k;
  uint32_t align_a, align_b, align_out;
  bool operator==(const LtKey&) const = default;
};

struct LtKeyHash {
  size_t operator()(const LtKey& key) const {
    size_t h = 0;
    for (int64_t v : {int64_t(key.device), int64_t(key.epilogue), int64_t(key.dtype), int64_t(key.out_dtype),
                      int64_t(key.compute), int64_t(key.trans_a) * 2 + int64_t(key.trans_b), key.m, key.n, key.k,
                      int64_t(key.align_a), int64_t(key.align_b), int64_t(key.align_out)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

struct LtChoice {
  bool found = false;  // false: cuBLASLt has no fused algorithm for this key, the caller runs the unfused path
  cublasLtMatmulAlgo_t algo{};
};

// One column-major product as cuBLASLt sees it: D (m x n, ld m) = op(A) (m x k) op(B) (k x n), A stored (m x k)
// (or (k x m) when trans_a) with leading dimension lda, B stored (k x n) (or (n x k) when trans_b) with ldb.
struct LtProduct {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb;
};

// Runs `p` with `epilogue`: A, B of `dtype`, D (and C, unused: beta = 0) of `out_dtype`. The epilogue's vector (the
// bias it adds, or the bias gradient it writes; out_dtype, the default BIAS_DATA_TYPE) has one value per row of D
// (BIAS, GELU_AUX_BIAS, DGELU_BGRAD, BGRADA); aux (the GELU input) has D's layout, ld m. Returns false (nothing
// done) where cuBLASLt has no algorithm for the key.
bool lt_matmul(int device, cudaStream_t stream, DType dtype, DType out_dtype, cublasLtEpilogue_t epilogue,
               const LtProduct& p, const void* a_ptr, const void* b_ptr, const void* bias, const void* aux, void* out) {
  if (p.m == 0 || p.n == 0 || p.k == 0) return false;
  // The vector and aux have no alignment preference to declare; to be safe, views of them that are not 16-byte
  // aligned take the unfused path. cuBLASLt wants the GELU aux's leading dimension a multiple of 8.
  if (reinterpret_cast<uintptr_t>(bias) % 16 != 0 || reinterpret_cast<uintptr_t>(aux) % 16 != 0) return false;
  if (aux != nullptr && p.m % 8 != 0) return false;
  LtDevice& dev = lt(device);
  cudaDataType_t type = data_type(dtype), out_type = data_type(out_dtype);
  cublasComputeType_t compute = dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtCall call;
  if (cublas().LtMatmulDescCreate(&call.desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return false;
  MINIDL_CUBLAS_CHECK(
      cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (bias != nullptr)
    MINIDL_CUBLAS_CHECK(
        cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (aux != nullptr) {
    const int64_t aux_ld = p.m;
    MINIDL_CUBLAS_CHECK(
        cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    MINIDL_CUBLAS_CHECK(
        cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  const cublasOperation_t trans = CUBLAS_OP_T;
  if (p.trans_a)
    MINIDL_CUBLAS_CHECK(
        cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
  if (p.trans_b)
    MINIDL_CUBLAS_CHECK(
        cublas().LtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans, sizeof trans));
  MINIDL_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&call.a, type, uint64_t(p.trans_a ? p.k : p.m),
                                                    uint64_t(p.trans_a ? p.m : p.k), p.lda));
  MINIDL_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&call.b, type, uint64_t(p.trans_b ? p.n : p.k),
                                                    uint64_t(p.trans_b ? p.k : p.n), p.ldb));
  MINIDL_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&call.d, out_type, uint64_t(p.m), uint64_t(p.n), p.m));
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceCreate(&call.pref));
  size_t workspace = kLtWorkspace;
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &workspace, sizeof workspace));
  // The heuristic assumes 256-byte-aligned A, B, C and D unless told otherwise; the operands or out may be views
  // at an offset into their storage (a narrow of a contiguous tensor stays contiguous), and an algorithm picked
  // for 256-byte alignment faults (misaligned address) or fails on them. Tell it each pointer's real alignment.
  auto alignment = [](const void* ptr) {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    uint32_t a = 256;
    while (a > 1 && address % a != 0) a /= 2;
    return a;
  };
  const uint32_t align_a = alignment(a_ptr), align_b = alignment(b_ptr), align_out = alignment(out);
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                              &align_a, sizeof align_a));
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                              &align_b, sizeof align_b));
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                              &align_out, sizeof align_out));
  MINIDL_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                              &align_out, sizeof align_out));
  static std::mutex cache_mutex;
  static std::unordered_map<LtKey, LtChoice, LtKeyHash> cache;
  const LtKey key{device, epilogue, dtype, out_dtype, compute, p.trans_a, p.trans_b,
                  p.m,    p.n,      p.k,   align_a,   align_b, align_out};
  LtChoice choice;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) {
      choice = it->second;
    } else {
      cublasLtMatmulHeuristicResult_t heuristic{};
      int found = 0;
      choice.found = cublas().LtMatmulAlgoGetHeuristic(dev.handle, call.desc, call.a, call.b, call.d, call.d, call.pref,
                                                       1, &heuristic, &found) == CUBLAS_STATUS_SUCCESS &&
                     found > 0;
      if (choice.found) choice.algo = heuristic.algo;
      cache.emplace(key, choice);
    }
  }
  if (!choice.found) return false;  // no fused algorithm for this shape: the caller runs the unfused path
  const float one = 1.0f, zero = 0.0f;
  MINIDL_CUBLAS_CHECK(cublas().LtMatmul(dev.handle, call.desc, &one, a_ptr, call.a, b_ptr, call.b, &zero, out, call.d,
                                        out, call.d, &choice.algo, dev.workspace, kLtWorkspace, stream));
  minidl::cuda::detail::count_library_launch();
  return true;
}

// linear's forward and the GELU products, row-major out (rows, n) = x (rows, k) w: column-major out^T (n x rows)
// = op(w) (n x k) x^T (k x rows). w is stored (k, n) row-major (a linear's weight: transposed = false), or (n, k)
// (the weight of the GEMM whose input gradient this is: transposed = true, op = T). The epilogue's vector has one
// value per column of the row-major out.
LtProduct forward_product(bool w_transposed, int64_t rows, int64_t n, int64_t k) {
  return {w_transposed, false, n, rows, k, w_transposed ? k : n, k};
}

}  // namespace

void load_gemm_library() { (void)cublas(); }

bool gemm_bias(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
               const void* w, const void* bias, void* out) {
  return lt_matmul(device, stream, dtype, dtype, CUBLASLT_EPILOGUE_BIAS, forward_product(false, rows, n, k), w, x, bias,
                   nullptr, out);
}

// cuBLASLt's GELU epilogues are the tanh approximation, GPT-2's (ops/kernels/gelu.h); the aux it writes is the
// GELU input in out's dtype (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE left at its default).
bool gemm_bias_gelu(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* x,
                    const void* w, const void* bias, void* out, void* aux) {
  return lt_matmul(device, stream, dtype, dtype, bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                   forward_product(false, rows, n, k), w, x, bias, aux, out);
}

// DGELU_BGRAD writes the bias gradient (n values, out's dtype) through the bias pointer: the column sums of dpre,
// reduced inside the GEMM in a fixed order.
bool gemm_dgelu_bgrad(int device, cudaStream_t stream, DType dtype, int64_t rows, int64_t n, int64_t k, const void* dy,
                      const void* w, const void* aux, void* dpre, void* dbias) {
  return lt_matmul(device, stream, dtype, dtype, dbias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU,
                   forward_product(true, rows, n, k), w, dy, dbias, aux, dpre);
}

// The weight gradient, row-major dw (k, n) = x^T dy: column-major dw^T (n x k) = dy^T (n x rows) x (rows x k). dy
// stored (rows, n) row-major is the column-major A (n x rows, ld n) as it is; x stored (rows, k) is (k x rows, ld k),
// taken transposed as B. The bias gradient, one value per column of the row-major dy, is one per row of D and the
// reduction runs over the GEMM's k (= rows) through A: BGRADA (BGRADB would reduce B = x, and size the vector by
// D's columns, k). The vector is out_dtype: f32 under mixed precision, next to the f32 dw.
bool gemm_wgrad_bgrad(int device, cudaStream_t stream, DType dtype, DType out_dtype, int64_t rows, int64_t k, int64_t n,
                      const void* x, const void* dy, void* dw, void* dbias) {
  if (out_dtype != dtype && out_dtype != DType::f32) return false;
  return lt_matmul(device, stream, dtype, out_dtype, CUBLASLT_EPILOGUE_BGRADA, {false, true, n, k, rows, n, k}, dy, x,
                   dbias, nullptr, dw);
}

namespace {

// C of c_dtype: the operands' own dtype (gemm), or f32 (gemm_f32_out: cuBLAS's mixed-precision GEMM, 16-bit A and
// B with an f32 C and f32 compute, a supported combination of cublasGemmEx).
void gemm_typed(int device, cudaStream_t stream, DType dtype, DType c_dtype, int64_t batch, int64_t M, int64_t N,
                int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc,
                int64_t c_batch_stride) {
  if (batch == 0 || M == 0 || N == 0) return;
  cublasHandle_t h = handle(device, stream);
  cudaDataType_t type = data_type(dtype), c_type = data_type(c_dtype);
  // 16-bit operands always run on tensor cores (f32 accumulation); f32 uses TF32 only when asked.
  cublasComputeType_t compute = dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MINIDL_CUBLAS_CHECK(cublas().GemmStridedBatchedEx(
      h, op(B.trans), op(A.trans), int(N), int(M), int(K), &alpha, B.ptr, type, int(B.ld), B.batch_stride, A.ptr, type,
      int(A.ld), A.batch_stride, &beta, C, c_type, int(ldc), c_batch_stride, int(batch), compute, CUBLAS_GEMM_DEFAULT));
  minidl::cuda::detail::count_library_launch();
}

}  // namespace

void gemm(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
          const GemmOperand& A, const GemmOperand& B, float beta, void* C, int64_t ldc, int64_t c_batch_stride) {
  gemm_typed(device, stream, dtype, dtype, batch, M, N, K, alpha, A, B, beta, C, ldc, c_batch_stride);
}

void gemm_f32_out(int device, cudaStream_t stream, DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K,
                  float alpha, const GemmOperand& A, const GemmOperand& B, float beta, float* C, int64_t ldc,
                  int64_t c_batch_stride) {
  gemm_typed(device, stream, dtype, DType::f32, batch, M, N, K, alpha, A, B, beta, C, ldc, c_batch_stride);
}

}  // namespace minidl::ops::cuda
