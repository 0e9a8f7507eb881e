// Elementwise ops on the GPU (ops/elementwise.h, plain gelu of ops/gelu.h; CPU reference ops/elementwise.cpp and
// ops/cpu/gelu.cpp).
//
// One grid-stride kernel per (op, storage type, path), the op a template argument so each instantiation is a
// straight loop. The launcher first merges dimensions the way ops/strided_loop.h does (size-1 dimensions dropped,
// neighbours merged where every operand steps through them as one), so a same-shape contiguous op becomes a flat
// run: that run takes the vector path (four elements per access: 128-bit loads for f32) when every pointer is
// aligned; anything else (views, broadcasts) takes the strided path, which turns each output index into one offset
// per input. Consecutive threads write consecutive outputs, so stores are always coalesced.
#include "ops/cuda/device_utils.h"
#include "ops/cuda/elementwise.h"
#include "ops/kernels/gelu.h"

namespace minidl::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;

// expf rather than __expf: memory-bound kernels, so the accurate exp costs nothing and stays near the CPU's bits.
struct DeviceExp {
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <UnaryOp kOp>
__device__ __forceinline__ float unary_apply(float x, float s) {
  if constexpr (kOp == UnaryOp::kCopy)
    return x;
  else if constexpr (kOp == UnaryOp::kNeg)
    return -x;
  else if constexpr (kOp == UnaryOp::kExp)
    return expf(x);
  else if constexpr (kOp == UnaryOp::kLog)
    return logf(x);
  else if constexpr (kOp == UnaryOp::kTanh)
    return tanhf(x);
  else if constexpr (kOp == UnaryOp::kSqrt)
    return sqrtf(x);
  else if constexpr (kOp == UnaryOp::kSquare)
    return x * x;
  else if constexpr (kOp == UnaryOp::kAddScalar)
    return x + s;
  else if constexpr (kOp == UnaryOp::kMulScalar)
    return x * s;
  else
    return kernels::gelu_tanh(x, DeviceExp{});  // kGelu
}

template <BinaryOp kOp>
__device__ __forceinline__ float binary_apply(float a, float b) {
  if constexpr (kOp == BinaryOp::kAdd)
    return a + b;
  else if constexpr (kOp == BinaryOp::kSub)
    return a - b;
  else if constexpr (kOp == BinaryOp::kMul)
    return a * b;
  else if constexpr (kOp == BinaryOp::kDiv)
    return a / b;
  else if constexpr (kOp == BinaryOp::kTanhBackward)
    return a * (1.0f - b * b);
  else
    return a * kernels::gelu_tanh_grad(b, DeviceExp{});  // kGeluBackward
}

// kVec consecutive elements of storage type T moved as one access (16 bytes for f32, 8 for 16-bit types).
template <class T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Offsets of output element i in the first kInputs inputs, over the merged sizes (innermost dimension last): one
// division per dimension, shared by the inputs. Index is uint32_t when every index and offset fits (the launcher
// checks): a 32-bit division is a few instructions, a 64-bit one a long software routine.
template <int kInputs, class Index>
__device__ __forceinline__ void offsets_of(Index i, const ElementwiseLayout& l, Index (&offset)[kInputs]) {
  for (int k = 0; k < kInputs; ++k) offset[k] = 0;
  for (int d = l.dims - 1; d > 0; --d) {
    const Index size = Index(l.sizes[d]), q = i / size, r = i - q * size;
    for (int k = 0; k < kInputs; ++k) offset[k] += r * Index(l.strides[k][d]);
    i = q;
  }
  for (int k = 0; k < kInputs; ++k) offset[k] += i * Index(l.strides[k][0]);
}

// Contiguous operands: groups of kVec when kVector (all pointers aligned to a group), then the n % kVec tail.
template <UnaryOp kOp, class T, bool kVector>
__global__ void __launch_bounds__(kThreads) unary_flat_kernel(const T* x, T* out, int64_t n, float s) {
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
  const int64_t groups = kVector ? n / kVec : 0;
  for (int64_t g = first; g < groups; g += stride) {
    Vec<T> v = reinterpret_cast<const Vec<T>*>(x)[g];
    for (int k = 0; k < kVec; ++k) v.v[k] = from_float<T>(unary_apply<kOp>(to_float(v.v[k]), s));
    reinterpret_cast<Vec<T>*>(out)[g] = v;
  }
  for (int64_t i = groups * kVec + first; i < n; i += stride)
    out[i] = from_float<T>(unary_apply<kOp>(to_float(x[i]), s));
}

template <UnaryOp kOp, class T, class Index>
__global__ void __launch_bounds__(kThreads)
    unary_strided_kernel(const T* x, T* out, Index n, float s, const ElementwiseLayout layout) {
  const Index stride = Index(gridDim.x) * kThreads;
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    Index offset[1];
    offsets_of<1>(i, layout, offset);
    out[i] = from_float<T>(unary_apply<kOp>(to_float(x[offset[0]]), s));
  }
}

template <BinaryOp kOp, class T, bool kVector>
__global__ void __launch_bounds__(kThreads) binary_flat_kernel(const T* a, const T* b, T* out, int64_t n) {
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
  const int64_t groups = kVector ? n / kVec : 0;
  for (int64_t g = first; g < groups; g += stride) {
    Vec<T> va = reinterpret_cast<const Vec<T>*>(a)[g];
    const Vec<T> vb = reinterpret_cast<const Vec<T>*>(b)[g];
    for (int k = 0; k < kVec; ++k) va.v[k] = from_float<T>(binary_apply<kOp>(to_float(va.v[k]), to_float(vb.v[k])));
    reinterpret_cast<Vec<T>*>(out)[g] = va;
  }
  for (int64_t i = groups * kVec + first; i < n; i += stride)
    out[i] = from_float<T>(binary_apply<kOp>(to_float(a[i]), to_float(b[i])));
}

template <BinaryOp kOp, class T, class Index>
__global__ void __launch_bounds__(kThreads)
    binary_strided_kernel(const T* a, const T* b, T* out, Index n, const ElementwiseLayout layout) {
  const Index stride = Index(gridDim.x) * kThreads;
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    Index offset[2];
    offsets_of<2>(i, layout, offset);
    out[i] = from_float<T>(binary_apply<kOp>(to_float(a[offset[0]]), to_float(b[offset[1]])));
  }
}

// The layout with size-1 dimensions dropped and mergeable neighbours merged (the output, contiguous, merges with
// any pair the inputs merge). `inputs` is 1 or 2. A layout of one element becomes one dimension of size 1.
ElementwiseLayout merged(const ElementwiseLayout& in, int inputs, int64_t* numel) {
  ElementwiseLayout out;
  *numel = 1;
  for (int d = 0; d < in.dims; ++d) {
    const int64_t size = in.sizes[d];
    *numel *= size;
    if (size == 1) continue;
    bool merge = out.dims > 0;
    for (int k = 0; k < inputs && merge; ++k) merge = out.strides[k][out.dims - 1] == in.strides[k][d] * size;
    if (merge) {
      out.sizes[out.dims - 1] *= size;
      for (int k = 0; k < inputs; ++k) out.strides[k][out.dims - 1] = in.strides[k][d];
    } else {
      out.sizes[out.dims] = size;
      for (int k = 0; k < inputs; ++k) out.strides[k][out.dims] = in.strides[k][d];
      ++out.dims;
    }
  }
  if (out.dims == 0) {
    out.dims = 1;
    out.sizes[0] = 1;
    out.strides[0][0] = out.strides[1][0] = 1;
  }
  return out;
}

bool is_flat(const ElementwiseLayout& l, int inputs) {
  if (l.dims != 1) return false;
  for (int k = 0; k < inputs; ++k)
    if (l.strides[k][0] != 1) return false;
  return true;
}

// Whether 32-bit indices reach every element: the output's n (plus a grid's stride past it) and each input's
// largest offset (strides are never negative in minidl; a negative one takes the 64-bit path anyway).
bool fits_32_bits(const ElementwiseLayout& l, int inputs, int64_t n) {
  constexpr int64_t kLimit = int64_t(1) << 31;  // leaves room for i + stride in a uint32_t
  if (n >= kLimit) return false;
  for (int k = 0; k < inputs; ++k) {
    int64_t span = 0;
    for (int d = 0; d < l.dims; ++d) {
      if (l.strides[k][d] < 0) return false;
      span += (l.sizes[d] - 1) * l.strides[k][d];
    }
    if (span >= kLimit) return false;
  }
  return true;
}

template <class T, class... Ptrs>
bool vector_aligned(const Ptrs*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % (sizeof(T) * kVec) == 0) && ...);
}

template <UnaryOp kOp, class T>
cudaError_t launch_unary(const T* x, T* out, const ElementwiseLayout& layout, float s, cudaStream_t stream) {
  int64_t n = 0;
  const ElementwiseLayout l = merged(layout, 1, &n);
  if (n == 0) return cudaSuccess;
  const dim3 block(kThreads);
  if (is_flat(l, 1)) {
    if (vector_aligned<T>(x, out))
      return launch_kernel(unary_flat_kernel<kOp, T, true>, dim3(grid_stride_blocks(n / kVec + 1, kThreads)), block, 0,
                           stream, x, out, n, s);
    return launch_kernel(unary_flat_kernel<kOp, T, false>, dim3(grid_stride_blocks(n, kThreads)), block, 0, stream, x,
                         out, n, s);
  }
  const dim3 grid(grid_stride_blocks(n, kThreads));
  if (fits_32_bits(l, 1, n))
    return launch_kernel(unary_strided_kernel<kOp, T, uint32_t>, grid, block, 0, stream, x, out, uint32_t(n), s, l);
  return launch_kernel(unary_strided_kernel<kOp, T, int64_t>, grid, block, 0, stream, x, out, n, s, l);
}

template <BinaryOp kOp, class T>
cudaError_t launch_binary(const T* a, const T* b, T* out, const ElementwiseLayout& layout, cudaStream_t stream) {
  int64_t n = 0;
  const ElementwiseLayout l = merged(layout, 2, &n);
  if (n == 0) return cudaSuccess;
  const dim3 block(kThreads);
  if (is_flat(l, 2)) {
    if (vector_aligned<T>(a, b, out))
      return launch_kernel(binary_flat_kernel<kOp, T, true>, dim3(grid_stride_blocks(n / kVec + 1, kThreads)), block, 0,
                           stream, a, b, out, n);
    return launch_kernel(binary_flat_kernel<kOp, T, false>, dim3(grid_stride_blocks(n, kThreads)), block, 0, stream, a,
                         b, out, n);
  }
  const dim3 grid(grid_stride_blocks(n, kThreads));
  if (fits_32_bits(l, 2, n))
    return launch_kernel(binary_strided_kernel<kOp, T, uint32_t>, grid, block, 0, stream, a, b, out, uint32_t(n), l);
  return launch_kernel(binary_strided_kernel<kOp, T, int64_t>, grid, block, 0, stream, a, b, out, n, l);
}

template <class T>
cudaError_t unary(UnaryOp op, const T* x, T* out, const ElementwiseLayout& layout, float s, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::kCopy: return launch_unary<UnaryOp::kCopy>(x, out, layout, s, stream);
    case UnaryOp::kNeg: return launch_unary<UnaryOp::kNeg>(x, out, layout, s, stream);
    case UnaryOp::kExp: return launch_unary<UnaryOp::kExp>(x, out, layout, s, stream);
    case UnaryOp::kLog: return launch_unary<UnaryOp::kLog>(x, out, layout, s, stream);
    case UnaryOp::kTanh: return launch_unary<UnaryOp::kTanh>(x, out, layout, s, stream);
    case UnaryOp::kSqrt: return launch_unary<UnaryOp::kSqrt>(x, out, layout, s, stream);
    case UnaryOp::kSquare: return launch_unary<UnaryOp::kSquare>(x, out, layout, s, stream);
    case UnaryOp::kAddScalar: return launch_unary<UnaryOp::kAddScalar>(x, out, layout, s, stream);
    case UnaryOp::kMulScalar: return launch_unary<UnaryOp::kMulScalar>(x, out, layout, s, stream);
    case UnaryOp::kGelu: return launch_unary<UnaryOp::kGelu>(x, out, layout, s, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t binary(BinaryOp op, const T* a, const T* b, T* out, const ElementwiseLayout& layout, cudaStream_t stream) {
  switch (op) {
    case BinaryOp::kAdd: return launch_binary<BinaryOp::kAdd>(a, b, out, layout, stream);
    case BinaryOp::kSub: return launch_binary<BinaryOp::kSub>(a, b, out, layout, stream);
    case BinaryOp::kMul: return launch_binary<BinaryOp::kMul>(a, b, out, layout, stream);
    case BinaryOp::kDiv: return launch_binary<BinaryOp::kDiv>(a, b, out, layout, stream);
    case BinaryOp::kTanhBackward: return launch_binary<BinaryOp::kTanhBackward>(a, b, out, layout, stream);
    case BinaryOp::kGeluBackward: return launch_binary<BinaryOp::kGeluBackward>(a, b, out, layout, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t elementwise_unary(UnaryOp op, const float* x, float* out, const ElementwiseLayout& layout, float scalar,
                              cudaStream_t stream) {
  return unary(op, x, out, layout, scalar, stream);
}
cudaError_t elementwise_unary(UnaryOp op, const __half* x, __half* out, const ElementwiseLayout& layout, float scalar,
                              cudaStream_t stream) {
  return unary(op, x, out, layout, scalar, stream);
}
cudaError_t elementwise_unary(UnaryOp op, const __nv_bfloat16* x, __nv_bfloat16* out, const ElementwiseLayout& layout,
                              float scalar, cudaStream_t stream) {
  return unary(op, x, out, layout, scalar, stream);
}

cudaError_t elementwise_binary(BinaryOp op, const float* a, const float* b, float* out, const ElementwiseLayout& layout,
                               cudaStream_t stream) {
  return binary(op, a, b, out, layout, stream);
}
cudaError_t elementwise_binary(BinaryOp op, const __half* a, const __half* b, __half* out,
                               const ElementwiseLayout& layout, cudaStream_t stream) {
  return binary(op, a, b, out, layout, stream);
}
cudaError_t elementwise_binary(BinaryOp op, const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out,
                               const ElementwiseLayout& layout, cudaStream_t stream) {
  return binary(op, a, b, out, layout, stream);
}

}  // namespace minidl::ops::cuda
