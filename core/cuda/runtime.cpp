// Streams, events, the device guard, pinned buffers and CUDA error messages (contracts in core/cuda/cuda.h).
#include <atomic>
#include <mutex>
#include <utility>

#include "core/cuda/cuda.h"

namespace minidl::cuda {

namespace detail {
void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  const int rank = ::minidl::detail::process_rank();
  throw Error(::minidl::detail::concat(
      call, " failed", rank >= 0 ? " on rank " : "", rank >= 0 ? std::to_string(rank) : std::string(), ": ",
      cudaGetErrorString(status), " (", cudaGetErrorName(status), ") (", file, ":", line, ")"));
}
}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: report none
    return 0;
  }
  return n;
}

std::string device_name(int device) {
#if defined(MINIDL_CUDA_EMULATED)
  (void)device;
  return "CPU emulator of CUDA";
#else
  cudaDeviceProp prop{};
  MINIDL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
#endif
}

namespace {
constexpr int kMaxDevices = 16;
// Never destroyed: the runtime may already be torn down when static destructors run.
std::atomic<cudaStream_t> compute_streams[kMaxDevices] = {};
}  // namespace

cudaStream_t current_stream(int device) {
  MINIDL_CHECK(device >= 0 && device < kMaxDevices, "current_stream: device index ", device, " is out of range");
  static std::once_flag once[kMaxDevices];
  std::call_once(once[device], [device] {
    DeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    MINIDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    compute_streams[device] = stream;
  });
  return compute_streams[device];
}

cudaStream_t existing_stream(int device) {
  return device >= 0 && device < kMaxDevices ? compute_streams[device].load() : nullptr;
}

DeviceGuard::DeviceGuard(int device) {
  MINIDL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) MINIDL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() { (void)cudaSetDevice(previous_); }  // a destructor must not throw

Event::Event(bool timing) {
  MINIDL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { MINIDL_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::wait(cudaStream_t stream) const { MINIDL_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
void Event::synchronize() const {
  MINIDL_CUDA_CHECK(cudaEventSynchronize(event_));
  detail::count_host_sync();
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0.0f;
  MINIDL_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) MINIDL_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) (void)cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) (void)cudaFreeHost(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace minidl::cuda
