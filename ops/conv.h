// 2-D convolution and max pooling on channels-last (NHWC) images, without autograd.
//
//   ops::Conv2dOptions o{.stride = 1, .padding = 1};
//   Tensor y = ops::conv2d_forward(x, w, b, o);                     // x (N, H, W, C), w (K, R, S, C) -> (N, P, Q, K)
//   ops::Conv2dBackward g = ops::conv2d_backward(dy, x, w, o, true); // dx, dweight, dbias
//   Tensor p = ops::max_pool2d_forward(y, {.kernel = 2, .stride = 2});
//   Tensor dp = ops::max_pool2d_backward(dpool, y, p, {.kernel = 2, .stride = 2});
//
// Layouts are cuDNN's channels-last ones, so the CUDA backend hands the same memory to cuDNN unchanged:
//   x      (N, H, W, C)   images, channels last
//   weight (K, R, S, C)   K filters of R x S x C ("KRSC", cuDNN's CUDNN_TENSOR_NHWC filter layout)
//   bias   (K)            or undefined
//   y      (N, P, Q, K)   P = (H + 2 pad - dil (R - 1) - 1) / stride + 1, likewise Q
// Channels last also puts a convolution's channels where bias_gelu expects its bias (the last dimension).
// It is a cross-correlation (no kernel flip), as in every deep-learning library. Stride, padding and dilation
// are the same along both axes. Padding is zeros for the convolution; max pooling takes no padding.
//
// CPU: im2col + one BLAS GEMM per image, parallel over images; f32 and f64. CUDA (f32): cuDNN
// (ops/cuda/tensor/conv_cudnn.cpp), or, in the emulated backend, the CPU kernels below on the emulated device
// memory (ops/cuda/tensor/conv_emu.cpp).
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"

namespace minidl::ops {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
};

struct Pool2dOptions {
  int64_t kernel = 2;
  int64_t stride = 2;  // windows overlap when stride < kernel
};

// Every size of one convolution (or pooling: R = S = kernel, K = C, pad = 0, dil = 1), from the checks.
struct ConvGeometry {
  int64_t N, H, W, C;  // input
  int64_t K, R, S;     // filters
  int64_t P, Q;        // output height and width
  int64_t stride, pad, dil;
};

// y = conv(x, weight) + bias.
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o);

struct Conv2dBackward {
  Tensor dx;       // (N, H, W, C); undefined unless asked for (the first layer's input needs none)
  Tensor dweight;  // (K, R, S, C)
  Tensor dbias;    // (K): dy summed over N, P, Q (the caller drops it when the conv has no bias)
};

// dweight is summed over images in fixed blocks of images, then the blocks in order: the same bits whatever the
// thread count.
Conv2dBackward conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dOptions& o,
                               bool need_dx);

// Max over each kernel x kernel window: x (N, H, W, C) -> (N, P, Q, C), P = (H - kernel) / stride + 1.
Tensor max_pool2d_forward(const Tensor& x, const Pool2dOptions& o);
// The gradient goes to the first maximum of each window (row-major order), found again from x and y: nothing
// but the output is kept, as with cuDNN (whose choice among tied maxima may differ).
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Pool2dOptions& o);

// ---- the CPU kernels on raw contiguous memory (layouts above), after the checks ----
// Shared with the emulated CUDA backend, which runs them on the host memory behind emulated device tensors.
// bias may be null; dx may be null (not computed). dweight and dbias are overwritten.
void conv2d_forward_cpu(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y);
void conv2d_forward_cpu(const ConvGeometry& g, const double* x, const double* w, const double* b, double* y);
void conv2d_backward_cpu(const ConvGeometry& g, const float* dy, const float* x, const float* w, float* dx, float* dw,
                         float* db);
void conv2d_backward_cpu(const ConvGeometry& g, const double* dy, const double* x, const double* w, double* dx,
                         double* dw, double* db);
void max_pool2d_forward_cpu(const ConvGeometry& g, const float* x, float* y);
void max_pool2d_forward_cpu(const ConvGeometry& g, const double* x, double* y);
void max_pool2d_backward_cpu(const ConvGeometry& g, const float* dy, const float* x, const float* y, float* dx);
void max_pool2d_backward_cpu(const ConvGeometry& g, const double* dy, const double* x, const double* y, double* dx);

// ---- argument checks, shared by every backend's entry (ops/cpu/conv.cpp) ----
// x (N, H, W, C), weight (K, R, S, C), both contiguous, same float dtype and device; the output is not empty.
ConvGeometry check_conv2d(const char* op, const Tensor& x, const Tensor& weight, const Conv2dOptions& o);
// x (N, H, W, C); the window fits.
ConvGeometry check_pool2d(const char* op, const Tensor& x, const Pool2dOptions& o);

// The CUDA kernels, filled by minidl::cuda::register_backend() (ops/cuda/tensor/conv_*.cpp).
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Conv2dOptions&)> conv2d_forward_device{
    "conv2d"};
inline DeviceKernel<Conv2dBackward(const Tensor&, const Tensor&, const Tensor&, const Conv2dOptions&, bool)>
    conv2d_backward_device{"conv2d_backward"};
inline DeviceKernel<Tensor(const Tensor&, const Pool2dOptions&)> max_pool2d_forward_device{"max_pool2d"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, const Tensor&, const Pool2dOptions&)>
    max_pool2d_backward_device{"max_pool2d_backward"};

}  // namespace minidl::ops
