// conv2d and max_pool2d on CUDA devices through cuDNN (minidl_cuda_backend, when cmake/FindCUDNN.cmake finds
// cuDNN). f32, channels last: ops/conv.h's layouts are cuDNN's CUDNN_TENSOR_NHWC ones (filters KRSC), so tensors
// go to cuDNN as they are, with no transposition.
//
// This is cuDNN's legacy convolution API (cudnnConvolutionForward and friends): marked deprecated in cuDNN 9 in
// favour of the graph API, still shipped, and the shortest path to a correct NHWC convolution. The math type
// follows the matmuls' TF32 switch (ops::allow_tf32(), read at each call, part of the algorithm cache's key):
// CUDNN_DEFAULT_MATH with it, which lets cuDNN use TF32 tensor cores on Ampere and later (results then differ from
// the CPU's f32 by about 1e-3 relative), CUDNN_FMA_MATH (plain f32) without it, the default.
//
// One cuDNN handle per device, created on first use and bound to the device's compute stream; workspaces come
// from the caching allocator as device tensors, freed stream-ordered when the call returns. Algorithms are
// chosen by cuDNN's heuristics (the _v7 queries, no benchmarking) once per shape and remembered.
#include <cudnn.h>

#include <array>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/conv.h"
#include "ops/matmul.h"
#include "ops/cuda/tensor/register.h"

namespace minidl::ops::cuda {
namespace {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  const int rank = ::minidl::detail::process_rank();
  throw Error(::minidl::detail::concat(call, " failed", rank >= 0 ? " on rank " : "",
                                       rank >= 0 ? std::to_string(rank) : std::string(), ": ",
                                       cudnnGetErrorString(status), " (", file, ":", line, ")"));
}

#define MINIDL_CUDNN_CHECK(call) MINIDL_STATUS_CHECK(call, #call, CUDNN_STATUS_SUCCESS, throw_cudnn_error)

// The device's cuDNN handle, bound to its compute stream (the caller holds an OnDevice for that device). Handles
// live until the process exits: destroying them after the CUDA runtime has shut down would fail.
cudnnHandle_t handle(const OnDevice& on, int device) {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) >= handles.size()) handles.resize(size_t(device) + 1, nullptr);
  if (!handles[size_t(device)]) MINIDL_CUDNN_CHECK(cudnnCreate(&handles[size_t(device)]));
  MINIDL_CUDNN_CHECK(cudnnSetStream(handles[size_t(device)], on.stream));
  return handles[size_t(device)];
}

// Descriptors, destroyed with their scope.
struct TensorDesc {
  // An (n, h, w, c) f32 tensor stored channels last.
  TensorDesc(int64_t n, int64_t h, int64_t w, int64_t c) {
    MINIDL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc));
    MINIDL_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, int(n), int(c), int(h), int(w)));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(desc); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t desc = nullptr;
};

// The filters, bias and convolution of one ConvGeometry.
struct ConvDescs {
  explicit ConvDescs(const ConvGeometry& g) : x(g.N, g.H, g.W, g.C), y(g.N, g.P, g.Q, g.K), bias(1, 1, 1, g.K) {
    MINIDL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    MINIDL_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, int(g.K), int(g.C), int(g.R), int(g.S)));
    MINIDL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    MINIDL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, int(g.pad), int(g.pad), int(g.stride), int(g.stride),
                                                       int(g.dil), int(g.dil), CUDNN_CROSS_CORRELATION,
                                                       CUDNN_DATA_FLOAT));
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  ~ConvDescs() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
  }
  ConvDescs(const ConvDescs&) = delete;
  ConvDescs& operator=(const ConvDescs&) = delete;
  TensorDesc x, y, bias;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

struct PoolDesc {
  explicit PoolDesc(const ConvGeometry& g) {
    MINIDL_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc));
    // CUDNN_POOLING_MAX_DETERMINISTIC: backward sends each window's gradient to one maximum, like the CPU.
    MINIDL_CUDNN_CHECK(cudnnSetPooling2dDescriptor(desc, CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_NOT_PROPAGATE_NAN,
                                                   int(g.R), int(g.S), 0, 0, int(g.stride), int(g.stride)));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(desc); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t desc = nullptr;
};

// The three algorithms of one convolution shape, with the workspace each needs.
struct Algos {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t fwd_bytes, bwd_data_bytes, bwd_filter_bytes;
};

// The first algorithm the heuristics rank as usable.
template <class Perf, class Query>
Perf best(const char* what, Query query) {
  constexpr int kRequested = 8;
  std::array<Perf, kRequested> perf{};
  int returned = 0;
  MINIDL_CUDNN_CHECK(query(kRequested, &returned, perf.data()));
  for (int i = 0; i < returned; ++i)
    if (perf[size_t(i)].status == CUDNN_STATUS_SUCCESS) return perf[size_t(i)];
  MINIDL_CHECK(false, "conv2d: cuDNN offers no ", what, " algorithm for this shape");
  return perf[0];
}

const Algos& algos(cudnnHandle_t h, const ConvDescs& d, const ConvGeometry& g, int device) {
  // The math type is part of the key: ConvDescs sets it from allow_tf32() at every call, and an algorithm (and
  // its workspace size) chosen under CUDNN_DEFAULT_MATH is not valid for a descriptor with CUDNN_FMA_MATH (cuDNN
  // rejects it, or needs more workspace than was sized) once set_allow_tf32 changes after the first call.
  using Key = std::array<int64_t, 12>;
  static std::mutex mutex;
  static std::map<Key, Algos> cache;
  Key key{device, g.N, g.H, g.W, g.C, g.K, g.R, g.S, g.stride, g.pad, g.dil, allow_tf32() ? 1 : 0};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto fwd = best<cudnnConvolutionFwdAlgoPerf_t>("forward", [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* p) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.desc, d.w, d.conv, d.y.desc, n, got, p);
  });
  auto data = best<cudnnConvolutionBwdDataAlgoPerf_t>(
      "backward-data", [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y.desc, d.conv, d.x.desc, n, got, p);
      });
  auto filter = best<cudnnConvolutionBwdFilterAlgoPerf_t>(
      "backward-filter", [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.desc, d.y.desc, d.conv, d.w, n, got, p);
      });
  Algos a{fwd.algo, data.algo, filter.algo, 0, 0, 0};
  MINIDL_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x.desc, d.w, d.conv, d.y.desc, a.fwd, &a.fwd_bytes));
  MINIDL_CUDNN_CHECK(
      cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y.desc, d.conv, d.x.desc, a.bwd_data, &a.bwd_data_bytes));
  MINIDL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.desc, d.y.desc, d.conv, d.w, a.bwd_filter,
                                                                    &a.bwd_filter_bytes));
  return cache.emplace(key, a).first->second;
}

// `bytes` of scratch on the tensor's device (no allocation for none).
Tensor workspace(size_t bytes, const Tensor& like) {
  return bytes ? Tensor::empty({int64_t(bytes)}, DType::u8, like.device()) : Tensor();
}
void* ptr(const Tensor& t) { return t.defined() ? t.raw_device_data() : nullptr; }

constexpr float kOne = 1.0f, kZero = 0.0f;

Tensor conv_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  check_f32("conv2d", "x", x);
  ConvGeometry g = check_conv2d("conv2d", x, weight, o);
  OnDevice on(x);
  cudnnHandle_t h = handle(on, x.device().index);
  ConvDescs d(g);
  const Algos& a = algos(h, d, g, x.device().index);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.K}, x.dtype(), x.device());
  Tensor ws = workspace(a.fwd_bytes, x);
  MINIDL_CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, d.x.desc, x.device_data<float>(), d.w,
                                             weight.device_data<float>(), d.conv, a.fwd, ptr(ws), a.fwd_bytes, &kZero,
                                             d.y.desc, y.device_data<float>()));
  if (bias.defined())
    MINIDL_CUDNN_CHECK(
        cudnnAddTensor(h, &kOne, d.bias.desc, bias.device_data<float>(), &kOne, d.y.desc, y.device_data<float>()));
  return y;
}

Conv2dBackward conv_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dOptions& o,
                             bool need_dx) {
  check_f32("conv2d_backward", "x", x);
  ConvGeometry g = check_conv2d("conv2d_backward", x, weight, o);
  OnDevice on(x);
  cudnnHandle_t h = handle(on, x.device().index);
  ConvDescs d(g);
  const Algos& a = algos(h, d, g, x.device().index);
  Conv2dBackward r{need_dx ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                   Tensor::empty(weight.shape(), x.dtype(), x.device()), Tensor::empty({g.K}, x.dtype(), x.device())};
  const float* pdy = dy.device_data<float>();
  if (need_dx) {
    Tensor ws = workspace(a.bwd_data_bytes, x);
    MINIDL_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &kOne, d.w, weight.device_data<float>(), d.y.desc, pdy, d.conv,
                                                    a.bwd_data, ptr(ws), a.bwd_data_bytes, &kZero, d.x.desc,
                                                    r.dx.device_data<float>()));
  }
  Tensor ws = workspace(a.bwd_filter_bytes, x);
  MINIDL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &kOne, d.x.desc, x.device_data<float>(), d.y.desc, pdy, d.conv,
                                                    a.bwd_filter, ptr(ws), a.bwd_filter_bytes, &kZero, d.w,
                                                    r.dweight.device_data<float>()));
  MINIDL_CUDNN_CHECK(
      cudnnConvolutionBackwardBias(h, &kOne, d.y.desc, pdy, &kZero, d.bias.desc, r.dbias.device_data<float>()));
  return r;
}

Tensor pool_forward(const Tensor& x, const Pool2dOptions& o) {
  check_f32("max_pool2d", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d", x, o);
  OnDevice on(x);
  cudnnHandle_t h = handle(on, x.device().index);
  PoolDesc pool(g);
  TensorDesc xd(g.N, g.H, g.W, g.C), yd(g.N, g.P, g.Q, g.C);
  Tensor y = Tensor::empty({g.N, g.P, g.Q, g.C}, x.dtype(), x.device());
  MINIDL_CUDNN_CHECK(cudnnPoolingForward(h, pool.desc, &kOne, xd.desc, x.device_data<float>(), &kZero, yd.desc,
                                         y.device_data<float>()));
  return y;
}

Tensor pool_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  check_f32("max_pool2d_backward", "x", x);
  ConvGeometry g = check_pool2d("max_pool2d_backward", x, o);
  OnDevice on(x);
  cudnnHandle_t h = handle(on, x.device().index);
  PoolDesc pool(g);
  TensorDesc xd(g.N, g.H, g.W, g.C), yd(g.N, g.P, g.Q, g.C);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  MINIDL_CUDNN_CHECK(cudnnPoolingBackward(h, pool.desc, &kOne, yd.desc, y.device_data<float>(), yd.desc,
                                          dy.device_data<float>(), xd.desc, x.device_data<float>(), &kZero, xd.desc,
                                          dx.device_data<float>()));
  return dx;
}

void register_conv() {
  conv2d_forward_device.set(DeviceKind::kCUDA, &conv_forward);
  conv2d_backward_device.set(DeviceKind::kCUDA, &conv_backward);
  max_pool2d_forward_device.set(DeviceKind::kCUDA, &pool_forward);
  max_pool2d_backward_device.set(DeviceKind::kCUDA, &pool_backward);
}

}  // namespace

MINIDL_REGISTER_CUDA_KERNELS(register_conv);

}  // namespace minidl::ops::cuda
