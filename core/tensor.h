// Tensor: a handle (shared pointer) to storage + byte offset + shape + strides + dtype + autograd metadata.
//
//   Tensor x = Tensor::zeros({B, T, C});          // f32 on the CPU
//   Tensor w = Tensor::randn({C, C}, Philox(/*seed=*/1)).set_requires_grad(true);
//   Tensor y = matmul(x, w);                      // differentiable ops: autograd/functions.h
//   y.sum().backward();  w.grad();
//
// Copies of a Tensor share everything (like torch.Tensor). Views (reshape of contiguous data, transpose, narrow)
// share storage; contiguous() copies only when needed. View methods are differentiable: they are defined in
// autograd/views.cpp. Raw, non-recording primitives (as_strided, copy_, fill_) live here.
//
// Device tensors (Device::cuda(i)) need a registered backend (core/device_backend.h, library minidl_cuda_backend).
// data<T>() and raw_data() are for CPU code and refuse a device tensor; device code uses device_data<T>().
// to_vector(), item() and printing copy a device tensor to the host first.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/device_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/memory.h"
#include "core/shape.h"

namespace minidl {

namespace autograd {
class Node;
}
namespace nn {
struct ParamLayout;  // nn/param_layout.h: a parameter's place in the one-process model
}

class Tensor;
using Strides = Shape;

// A buffer from an allocator. Freed (returned to the cache) when the last tensor using it goes away.
class Storage {
 public:
  // Non-CPU devices allocate through the registered DeviceBackend; without one this throws naming the device.
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return alloc_.ptr; }
  size_t bytes() const { return alloc_.bytes; }
  Device device() const { return device_; }
  MemTag tag() const { return alloc_.tag; }
  // Frees the bytes but keeps the object, so every tensor viewing it stays a valid handle that must not be read
  // until reallocate(). ZeRO-3 frees a gathered block's parameters this way: the views autograd saved for backward
  // alias the storage, so dropping references alone would keep the bytes alive until backward.
  void release();
  // New bytes (contents undefined) under the current memory tag, for a released storage.
  void reallocate(size_t bytes);

 private:
  Allocation alloc_;
  Device device_;
  const DeviceBackend* backend_ = nullptr;  // null on the CPU
};

struct TensorImpl;
using GradReadyHook = std::function<void(Tensor& grad)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;             // accumulated gradient of a leaf
  std::shared_ptr<autograd::Node> grad_fn;      // node that produced this tensor (non-leaf)
  uint32_t output_nr = 0;                       // which output of grad_fn
  std::weak_ptr<autograd::Node> accumulator;    // a leaf's AccumulateGrad node, made on first use
  std::vector<GradReadyHook> grad_ready_hooks;  // fired after this leaf's gradient is final for a backward
  // Set by a scheme that takes over this parameter's update (ZeRO steps its shard parameters instead): an optimizer
  // built over the parameter refuses it with this message, which names what to optimise instead.
  std::string update_owner;
  // How this parameter lies in the one-process model (nn/param_layout.h; null: whole), set by the parallelism that
  // split or replicated it.
  std::shared_ptr<const nn::ParamLayout> layout;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // bytes into storage
  Shape shape;
  Strides strides;  // in elements
  DType dtype = DType::f32;
  AutogradMeta autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (all contiguous) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32);
  // Copies `values` (converted to dtype) into a new tensor of `shape`; numel must match.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32);
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64);
  static Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape, DType dtype = DType::i32);
  static Tensor arange(int64_t n, DType dtype = DType::f32);
  // Element i is rng.normal(i) (standard normal) or rng.uniform(i) (in [0, 1)), computed in f32 and converted to
  // dtype: a pure function of the generator's (seed, stream) and the shape, the same on every machine and rank.
  static Tensor randn(const Shape& shape, const Philox& rng, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor rand(const Shape& shape, const Philox& rng, DType dtype = DType::f32, Device device = Device::cpu());

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int dim() const { return impl_->shape.size(); }
  // size(-1) is the last dimension.
  int64_t size(int d) const { return impl_->shape[wrap_dim(d)]; }
  int64_t stride(int d) const { return impl_->strides[wrap_dim(d)]; }
  int64_t numel() const { return impl_->shape.numel(); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  int wrap_dim(int d) const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }

  // ---- data access ----
  // Pointer to the first element, for CPU code: refuses a device tensor (its memory is not host-addressable).
  void* raw_data() const {
    MINIDL_CHECK(device().is_cpu(), "raw_data(): the tensor is on ", device(),
                 "; CPU code cannot read device memory (copy it with to(Device::cpu()))");
    return raw_device_data();
  }
  // Typed pointer to the first element of a CPU tensor; checks the dtype and the device.
  template <class T>
  T* data() const {
    check_data_access<T>("data");
    MINIDL_CHECK(device().is_cpu(), "data<", dtype_name(dtype_of<T>::value), ">(): the tensor is on ", device(),
                 "; CPU code cannot read device memory (a device kernel uses device_data<T>())");
    return static_cast<T*>(raw_device_data());
  }
  // The same pointers on any device: for device kernels and backends, never dereferenced on the host.
  void* raw_device_data() const { return static_cast<char*>(impl_->storage->data()) + impl_->offset; }
  template <class T>
  T* device_data() const {
    check_data_access<T>("device_data");
    return static_cast<T*>(raw_device_data());
  }
  // The single element of a one-element tensor, as double.
  double item() const;
  // All elements in logical (row-major) order.
  std::vector<double> to_vector() const;
  std::vector<float> to_float_vector() const;

  // ---- raw primitives (never recorded by autograd) ----
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset_elems) const;
  // Shapes must match; converts dtype; any strides; across devices (contiguous same-dtype copies go straight
  // through the backend, anything else is staged through a host copy).
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  // Same data, no autograd history.
  Tensor detach() const;
  // Makes this tensor (and every handle sharing it) refer to src's data: storage, offset, shape, strides and
  // dtype; its autograd state (requires_grad, grad, hooks) stays. What Module::to uses to move parameters that
  // layers hold by handle. Not recorded by autograd.
  void set_data(const Tensor& src);

  // ---- differentiable views and conversions (autograd/views.cpp) ----
  Tensor reshape(const Shape& shape) const;  // -1 infers one dimension; copies only if not viewable
  Tensor view(const Shape& shape) const;     // like reshape but requires a viewable layout
  Tensor transpose(int d0, int d1) const;
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor contiguous() const;
  Tensor to(DType dtype) const;
  Tensor clone() const;
  Tensor to(Device device) const;  // differentiable: backward moves the gradient back

  // ---- autograd ----
  bool requires_grad() const { return impl_->autograd.requires_grad; }
  // Marks a leaf as a parameter-like tensor whose gradient is accumulated into grad().
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return impl_->autograd.grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl_->autograd.grad); }
  void set_grad(const Tensor& g) { impl_->autograd.grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->autograd.grad_fn; }
  // Runs backward from this tensor (a scalar unless `grad` is given). Defined in autograd/engine.cpp.
  void backward(const Tensor& grad = Tensor()) const;
  // Called with the final gradient of this leaf once per backward, right after it is accumulated into grad().
  void register_grad_ready_hook(GradReadyHook hook);

 private:
  template <class T>
  void check_data_access(const char* accessor) const {
    MINIDL_CHECK(defined(), accessor, "<", dtype_name(dtype_of<T>::value), ">(): undefined tensor");
    MINIDL_CHECK(dtype() == dtype_of<T>::value, accessor, "<", dtype_name(dtype_of<T>::value), ">(): tensor has dtype ",
                 dtype());
  }

  std::shared_ptr<TensorImpl> impl_;
};

// For an op's entry: throws "<op>: no kernel for <device> (got <name> on cuda:0)" unless t is on the CPU.
void check_cpu_op(const char* op, const char* name, const Tensor& t);

// Contiguous strides for a shape.
Strides contiguous_strides(const Shape& shape);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace minidl
