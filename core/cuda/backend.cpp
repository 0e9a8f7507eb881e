// The DeviceBackend that core's Storage and Tensor use for cuda devices: the caching allocator, copies and
// memsets ordered on each device's compute stream.
#include <cstring>
#include <memory>

#include "core/cuda/cuda.h"
#include "core/cuda/graph.h"
#include "core/device_backend.h"

namespace minidl::cuda {

namespace {

// Constant-initialised, so ops/cuda's registrar may set it during static initialisation in any file order.
FillKernel fill_kernel = nullptr;

Allocation backend_allocate(size_t bytes, int device) {
  Allocation a;
  a.tag = current_mem_tag();
  a.ptr = allocate(bytes, device, &a.bytes);
  return a;
}

void backend_free(const Allocation& a, int device) { free(a.ptr, device); }

// A copy that touches host memory completes before returning (the host may read or reuse it at once); a
// device-to-device copy stays queued on the destination's compute stream.
void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  const cudaMemcpyKind kind = dst_device.is_cuda()
                                  ? (src_device.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                  : cudaMemcpyDeviceToHost;
  cudaStream_t stream = current_stream(device);
  DeviceGuard guard(device);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // Peer copy through unified addressing; the source's pending work must finish before this stream reads it.
    // cudaEventRecord needs the event and the stream on the same device, so `ready` is created with the source
    // device current: created under `guard` (the destination), recording it on the source's stream fails on a GPU.
    cudaStream_t src_stream = current_stream(src_device.index);
    {
      DeviceGuard on_src(src_device.index);
      Event ready(false);
      ready.record(src_stream);
      ready.wait(stream);
    }
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    detail::count_copy(cudaMemcpyDefault, bytes);
    // The source's block goes back to the caching allocator for the source's stream only, and that stream may
    // overwrite the source as soon as the caller frees or writes it: order the source's stream after this read.
    Event copied(false);
    copied.record(stream);
    copied.wait(src_stream);
    return;
  }
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  detail::count_copy(kind, bytes);
  if (kind != cudaMemcpyDeviceToDevice) {
    MINIDL_CUDA_CHECK(cudaStreamSynchronize(stream));
    detail::count_host_sync();
  }
}

void backend_memset_zero(void* ptr, size_t bytes, int device) {
  DeviceGuard guard(device);
  MINIDL_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_stream(device)));
  detail::count_memset();
}

void backend_fill(void* ptr, int64_t count, const void* value, size_t element_bytes, int device) {
  MINIDL_ASSERT(element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8, "device fill of ",
                element_bytes, "-byte elements");
  const auto* bytes = static_cast<const unsigned char*>(value);
  bool same_bytes = true;  // zero, or any value of one repeated byte: a memset
  for (size_t i = 1; i < element_bytes; ++i) same_bytes = same_bytes && bytes[i] == bytes[0];
  DeviceGuard guard(device);
  if (same_bytes) {
    MINIDL_CUDA_CHECK(cudaMemsetAsync(ptr, bytes[0], size_t(count) * element_bytes, current_stream(device)));
    detail::count_memset();
    return;
  }
  uint64_t pattern = 0;
  std::memcpy(&pattern, value, element_bytes);
  MINIDL_ASSERT(fill_kernel != nullptr,
                "no device fill kernel registered (ops/cuda/tensor/fill.cpp is linked with the "
                "backend)");
  MINIDL_CUDA_CHECK(fill_kernel(ptr, count, int(element_bytes), pattern, current_stream(device)));
}

void backend_synchronize(int device) {
  MINIDL_CUDA_CHECK(cudaStreamSynchronize(current_stream(device)));
  detail::count_host_sync();
}

void* backend_graph_capture(int device, const std::function<void()>& work) {
  auto graph = std::make_unique<Graph>(device);
  graph->capture(work);
  return graph.release();
}

void backend_graph_replay(void* graph) { static_cast<Graph*>(graph)->replay(); }
void backend_graph_destroy(void* graph) { delete static_cast<Graph*>(graph); }

#if defined(MINIDL_CUDA_EMULATED)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

const DeviceBackend kBackend{.allocate = backend_allocate,
                             .free = backend_free,
                             .copy = backend_copy,
                             .memset_zero = backend_memset_zero,
                             .fill = backend_fill,
                             .synchronize = backend_synchronize,
                             .upload_async = upload_staged,
                             .device_count = device_count,
                             .device_name = device_name,
                             .emulated = kEmulated,
                             .graph_capture = backend_graph_capture,
                             .graph_replay = backend_graph_replay,
                             .graph_destroy = backend_graph_destroy};

// Registers at static-init time: the backend library is linked whole (core/cuda/CMakeLists.txt), so this object
// is in every program that links it, whether or not the program names anything of it.
// The trace hooks too (NVTX ranges, device time), so a program's --trace times its spans on the device.
[[maybe_unused]] const bool registered = (install_backend(), true);

}  // namespace

void install_backend() {
  register_device_backend(DeviceKind::kCUDA, &kBackend);
  install_trace_hooks();
}

void set_fill_kernel(FillKernel kernel) { fill_kernel = kernel; }

}  // namespace minidl::cuda
