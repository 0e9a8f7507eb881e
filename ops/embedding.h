// Embedding lookup (gather) and its backward (scatter-add), without autograd.
//
//   Tensor y = ops::embedding_forward(wte, ids);             // wte: (V, C), ids: (B, T) i32/i64 -> (B, T, C)
//   Tensor dwte = ops::embedding_backward(dy, ids, wte.size(0));
#pragma once

#include "core/tensor.h"
#include "ops/device_kernel.h"
#include "ops/nn_checks.h"

namespace minidl::ops {

// weight: (V, C) f32/f64; ids: any shape, i32 or i64, every id in [0, V) -> (*ids.shape, C).
Tensor embedding_forward(const Tensor& weight, const Tensor& ids);

// grad_out: (*ids.shape, C) -> dweight (V, C): row v is the sum of grad_out over the positions whose id is v,
// added in increasing position order whatever the thread count (bitwise reproducible). On a CUDA device the same
// order is kept unless set_deterministic_embedding_backward(false) allows float atomics (faster when a few ids
// dominate; the last bits then vary from run to run).
Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t vocab_size);

// Whether device embedding backward must be bitwise reproducible (default true; the CPU always is).
void set_deterministic_embedding_backward(bool deterministic);
bool deterministic_embedding_backward();

// ---- argument checks, shared by every backend's entry (the id range is checked by the kernel, on the data) ----
// The CUDA kernels (ops/cuda/tensor/embedding.cpp), filled by minidl::cuda::register_backend().
inline DeviceKernel<Tensor(const Tensor&, const Tensor&)> embedding_forward_device{"embedding"};
inline DeviceKernel<Tensor(const Tensor&, const Tensor&, int64_t)> embedding_backward_device{"embedding_backward"};

// Throws naming the first id of a CPU index tensor outside [0, vocab).
void embedding_check_ids(const Tensor& ids, int64_t vocab);

// Device ids and targets are range-checked on a host copy (a transfer that waits for the device). Within the scope
// of this guard, on this thread, the caller vouches that the i64 ids and targets it hands to embedding and
// cross_entropy (sum reduction) were checked on the host before upload, and their device entries skip that copy.
// nn::GPT::loss sets it for a batch it receives on the host; wrong ids under it index out of bounds on the device.
class HostCheckedIndicesGuard {
 public:
  HostCheckedIndicesGuard();
  ~HostCheckedIndicesGuard();
  HostCheckedIndicesGuard(const HostCheckedIndicesGuard&) = delete;
  HostCheckedIndicesGuard& operator=(const HostCheckedIndicesGuard&) = delete;

 private:
  bool previous_;
};
bool indices_checked_on_host();

inline void check_embedding(const Tensor& weight, const Tensor& ids) {
  check_float("embedding", "weight", weight);
  MINIDL_CHECK(weight.dim() == 2, "embedding: expected weight of shape (V, C), got ", weight.shape());
  check_index("embedding", "ids", ids);
}

}  // namespace minidl::ops
