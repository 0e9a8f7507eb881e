#include "core/device_backend.h"

#include <atomic>

#include "core/error.h"

namespace minidl {

namespace {
std::atomic<const DeviceBackend*> g_cuda_backend{nullptr};
}  // namespace

void register_device_backend(DeviceKind kind, const DeviceBackend* backend) {
  MINIDL_CHECK(kind == DeviceKind::kCUDA, "register_device_backend: only a CUDA backend can be registered");
  g_cuda_backend.store(backend, std::memory_order_release);
}

const DeviceBackend* find_device_backend(DeviceKind kind) {
  return kind == DeviceKind::kCUDA ? g_cuda_backend.load(std::memory_order_acquire) : nullptr;
}

const DeviceBackend& device_backend(Device device, const char* what) {
  const DeviceBackend* b = find_device_backend(device.kind);
  MINIDL_CHECK(b != nullptr, "cannot ", what, " on ", device,
               ": this build of minidl has no CUDA backend (link minidl_cuda_backend)");
  return *b;
}

}  // namespace minidl
