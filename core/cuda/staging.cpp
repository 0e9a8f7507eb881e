// Uploads through page-locked staging buffers (contract in core/cuda/cuda.h: upload_staged). A pageable
// cudaMemcpyAsync makes the host wait (the driver stages it itself, and the caller could overwrite the source at
// once); copying into our own pinned buffer first makes the copy truly asynchronous, and each buffer's event
// says when the device has read it, so it is never overwritten while a copy from it is still queued.
#include <cstring>
#include <memory>
#include <mutex>

#include "core/cuda/cuda.h"

namespace minidl::cuda {

namespace {

constexpr int kMaxDevices = 16;
// Buffers in the ring: a step uploads ids and targets, so 8 buffers let the host run 4 steps ahead of the device
// before it waits for the oldest upload.
constexpr int kStagingSlots = 8;

struct Slot {
  PinnedBuffer buffer;
  std::unique_ptr<Event> done;  // recorded after the last copy out of `buffer`
  bool in_flight = false;
};

struct Ring {
  std::mutex mutex;
  Slot slots[kStagingSlots];
  int next = 0;
};

Ring& ring(int device) {
  MINIDL_CHECK(device >= 0 && device < kMaxDevices, "upload_staged: device index ", device, " is out of range");
  static Ring* rings = new Ring[kMaxDevices];  // never destroyed: uploads may run during static destruction
  return rings[device];
}

}  // namespace

void upload_staged(void* dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return;
  Ring& r = ring(device);
  std::lock_guard lock(r.mutex);
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  MINIDL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  // Legal on a GPU, but a replay would copy whatever the staging buffer holds by then.
  MINIDL_CHECK(capturing == cudaStreamCaptureStatusNone, "upload_async of ", bytes, " bytes to cuda:", device,
               " while a CUDA graph captures: a replay would not copy this data again; copy it into the graph's "
               "input tensors before each replay instead (train/cuda_graph.h)");
  Slot& slot = r.slots[r.next];
  r.next = (r.next + 1) % kStagingSlots;
  if (!slot.done) slot.done = std::make_unique<Event>(/*timing=*/false);
  if (slot.in_flight) {
    // A query that finds the copy done is no wait; only a copy still queued makes the host block.
    const cudaError_t status = cudaEventQuery(slot.done->get());
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      slot.done->synchronize();  // counted as a host synchronisation
    } else {
      MINIDL_CUDA_CHECK(status);
    }
    slot.in_flight = false;
  }
  if (slot.buffer.bytes() < bytes) slot.buffer = PinnedBuffer(bytes);  // warm-up only: sizes repeat every step
  std::memcpy(slot.buffer.data(), src, bytes);
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst, slot.buffer.data(), bytes, cudaMemcpyHostToDevice, stream));
  detail::count_copy(cudaMemcpyHostToDevice, bytes);
  slot.done->record(stream);
  slot.in_flight = true;
}

}  // namespace minidl::cuda
