// Device queries and kernel attributes of the emulated runtime, plus error strings.
//
// The emulated machine has exactly one device (cudaGetDeviceCount reports 1, so the CUDA device path is taken
// and exercised). It describes itself as compute capability 8.0 with an A100's shared-memory limits (48 KiB
// per block by default, 163 KiB with cudaFuncAttributeMaxDynamicSharedMemorySize): a launch that fits here fits
// on Ampere and Hopper alike, and code choosing Hopper-only paths (which cannot be emulated) does not take them.
// One "multiprocessor" per worker thread.
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"

namespace minidl::emu::detail {
namespace {

struct SmemLimits {
  std::mutex mutex;
  std::unordered_map<const void*, size_t> bytes;  // raised by cudaFuncAttributeMaxDynamicSharedMemorySize
};
SmemLimits& smem_limits() {
  static SmemLimits limits;
  return limits;
}

cudaError_t fail(cudaError_t error) {
  set_last_error(error);
  return error;
}

cudaDeviceProp properties() {
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  std::strncpy(p.name, "minidl CUDA emulator", sizeof p.name - 1);
  p.totalGlobalMem = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  p.sharedMemPerBlock = kDefaultDynamicSmem;
  p.sharedMemPerBlockOptin = kMaxDynamicSmemOptin;
  p.sharedMemPerMultiprocessor = kMaxDynamicSmemOptin + 1024;
  p.regsPerBlock = p.regsPerMultiprocessor = 65536;
  p.warpSize = warpSize;
  p.memPitch = 0x7fffffff;
  p.maxThreadsPerBlock = kMaxThreadsPerBlock;
  p.maxThreadsDim[0] = p.maxThreadsDim[1] = 1024;
  p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 0x7fffffff;
  p.maxGridSize[1] = p.maxGridSize[2] = 65535;
  p.totalConstMem = 64 * 1024;
  p.major = 8;
  p.minor = 0;
  p.multiProcessorCount = options().workers;
  p.maxThreadsPerMultiProcessor = 2048;
  p.maxBlocksPerMultiProcessor = 32;
  p.l2CacheSize = 40 * 1024 * 1024;
  p.memoryBusWidth = 5120;
  p.textureAlignment = 512;
  p.concurrentKernels = p.unifiedAddressing = p.canMapHostMemory = p.memoryPoolsSupported = 1;
  return p;
}

}  // namespace

size_t max_dynamic_smem(const void* kernel) {
  SmemLimits& limits = smem_limits();
  std::lock_guard lock(limits.mutex);
  const auto it = limits.bytes.find(kernel);
  return it == limits.bytes.end() ? kDefaultDynamicSmem : it->second;
}

}  // namespace minidl::emu::detail

using minidl::emu::detail::fail;

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = minidl::emu::detail::properties();
  return cudaSuccess;
}

// The attributes kernels size themselves with; any other is reported as unsupported rather than invented.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  const cudaDeviceProp p = minidl::emu::detail::properties();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = static_cast<int>(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    default: return fail(cudaErrorNotSupported);
  }
  return cudaSuccess;
}

// Records the dynamic shared memory limit (checked at launch); the carveout preference is accepted and has no
// effect; other attributes (cluster sizes, ...) describe features the emulator does not have.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  using namespace minidl::emu::detail;
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
      if (value < 0 || static_cast<size_t>(value) > kMaxDynamicSmemOptin) return fail(cudaErrorInvalidValue);
      SmemLimits& limits = smem_limits();
      std::lock_guard lock(limits.mutex);
      limits.bytes[func] = static_cast<size_t>(value);
      return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    default: return fail(cudaErrorNotSupported);
  }
}

// ---- error strings: CUDA's own wording for the codes the emulator produces ----
namespace {
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
};
const ErrorText* find_error(cudaError_t code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}
}  // namespace

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e != nullptr ? e->text : "unrecognized error code";
}
const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e != nullptr ? e->name : "unrecognized error code";
}
