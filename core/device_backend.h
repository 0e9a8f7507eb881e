// The hook table through which core reaches a non-CPU device, so the minidl library itself never links a device
// runtime. A backend library (minidl_cuda_backend, or its emulated twin minidl_cuda_backend_emu) fills a DeviceBackend
// and registers it; Storage, Tensor::zeros/copy_/to and the host reads of device tensors go through it.
//
//   // a program that links minidl_cuda_backend has it registered before main() (core/cuda/cuda.h)
//   Tensor x = Tensor::zeros({4, 8}, DType::f32, Device::cuda(0));
//
// Without a registered backend, allocating on the device throws
//   "cannot allocate on cuda:0: this build of minidl has no CUDA backend (link minidl_cuda_backend)".
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/device.h"
#include "core/memory.h"

namespace minidl {

// Every function takes the device index it acts on. Pointers are device pointers unless the Device says CPU.
struct DeviceBackend {
  // bytes > 0. The Allocation's tag is the current MemTag; the backend charges the device's ledger.
  Allocation (*allocate)(size_t bytes, int device);
  void (*free)(const Allocation& a, int device);
  // Copies `bytes` between any two devices of this kind or the CPU. When dst or src is on the CPU the copy has
  // completed when the call returns; a device-to-device copy is ordered on the device's compute stream.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  // Zeroes `bytes` at a device pointer, ordered on the device's compute stream.
  void (*memset_zero)(void* ptr, size_t bytes, int device);
  // Sets `count` contiguous elements of `element_bytes` (1, 2, 4 or 8) bytes each to the value whose bytes are at
  // `value` (host memory, read before returning), ordered on the device's compute stream: no host copy.
  void (*fill)(void* ptr, int64_t count, const void* value, size_t element_bytes, int device);
  // Waits until all work queued on the device's compute stream has finished.
  void (*synchronize)(int device);
  // Copies `bytes` of host memory at `src` to the device pointer `dst` without waiting for the device: the bytes are
  // staged in page-locked memory before the call returns (the caller may reuse `src` at once) and copied on the
  // compute stream. The host waits only when every staging buffer still has an upload in flight. Null: the
  // backend has none, and upload_async (core/upload.h) falls back to copy.
  void (*upload_async)(void* dst, const void* src, size_t bytes, int device) = nullptr;

  // What programs ask of the runtime (train/device.h: --device, the device's name for MFU), so that the training
  // layer reaches a device through this table and a CPU-only program never links a device runtime.
  int (*device_count)() = nullptr;
  std::string (*device_name)(int device) = nullptr;
  bool emulated = false;  // the CPU emulator of the device (cuda_emu/), not the device itself
  // Graph capture (train/cuda_graph.h): runs `work` with the device's compute stream capturing and returns the
  // instantiated graph (an opaque handle; throws, capturing nothing, if `work` throws or cannot be captured);
  // replays it on the compute stream; frees it. Null: the backend cannot capture.
  void* (*graph_capture)(int device, const std::function<void()>& work) = nullptr;
  void (*graph_replay)(void* graph) = nullptr;
  void (*graph_destroy)(void* graph) = nullptr;
};

// Installs (or, with nullptr, removes) the backend of a device kind. kCPU cannot be replaced.
void register_device_backend(DeviceKind kind, const DeviceBackend* backend);
// The backend of `device`'s kind, or nullptr when none is registered.
const DeviceBackend* find_device_backend(DeviceKind kind);
// The backend of `device`; throws naming `what` and the device when none is registered.
const DeviceBackend& device_backend(Device device, const char* what);

}  // namespace minidl
