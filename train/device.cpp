#include "train/device.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#include "core/device_backend.h"
#include "core/error.h"

namespace minidl::train {

Device select_device(const std::string& flag, int local_rank) {
  if (flag == "cpu") return Device::cpu();
  int index = local_rank;
  bool ok = flag == "cuda";
  if (!ok && flag.rfind("cuda:", 0) == 0 && flag.size() > 5 &&
      flag.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoi(flag.substr(5));
    ok = true;
  }
  MINIDL_CHECK(ok, "--device: expected cpu, cuda or cuda:N, got '", flag, "'");
  // The backend registers itself when the program links one (minidl_device: real, emulated or none).
  const DeviceBackend* backend = find_device_backend(DeviceKind::kCUDA);
  MINIDL_CHECK(backend && backend->device_count, "--device ", flag,
               ": this program has no CUDA backend (a build "
               "with nvcc and the CUDA toolkit found, or -DMINIDL_CUDA_EMULATION=ON to run the device path on the CPU "
               "emulator, links one into minidl's programs; a program of its own links minidl::device)");
  const int count = backend->device_count();
  MINIDL_CHECK(count > 0, "--device ", flag, ": no CUDA device is visible");
  if (flag == "cuda") index = local_rank % count;  // one GPU per rank; ranks share GPUs when there are fewer
  MINIDL_CHECK(index < count, "--device ", flag, ": no such device (this machine has ", count, " CUDA device",
               count == 1 ? "" : "s", ")");
  return Device::cuda(index);
}

std::string device_name(Device device) {
  if (device.is_cuda()) {
    const DeviceBackend* backend = find_device_backend(DeviceKind::kCUDA);
    if (backend && backend->device_name) return backend->device_name(device.index);
  }
  return device.is_cpu() ? "cpu" : "cuda";
}

double gpu_peak_tflops(const std::string& name, DType dtype, bool tf32) {
  // NVIDIA's datasheet figures without sparsity: {16-bit tensor, TF32 tensor, FP32}.
  struct Peak {
    const char* match;
    double half, tf32, fp32;
  };
  static const Peak kPeaks[] = {
      {"H200", 989.4, 494.7, 66.9},   {"H100 PCIe", 756.0, 378.0, 51.2}, {"H100", 989.4, 494.7, 66.9},
      {"A100", 312.0, 156.0, 19.5},   {"A10G", 70.0, 35.0, 31.2},        {"A10", 125.0, 62.5, 31.2},
      {"L40S", 362.1, 183.0, 91.6},   {"L4", 121.0, 60.0, 30.3},         {"RTX 4090", 165.2, 82.6, 82.6},
      {"RTX 3090", 71.0, 35.6, 35.6}, {"V100", 125.0, 0.0, 15.7},        {"T4", 65.0, 0.0, 8.1}};
  for (const Peak& p : kPeaks)
    if (name.find(p.match) != std::string::npos)
      return dtype != DType::f32 ? p.half : (tf32 && p.tf32 > 0 ? p.tf32 : p.fp32);
  return 0.0;
}

bool cuda_is_emulated() {
  const DeviceBackend* backend = find_device_backend(DeviceKind::kCUDA);
  return backend && backend->emulated;
}

double peak_rss_mb() {
  // VmHWM is this process image's high-water mark. getrusage's ru_maxrss would do, except that Linux carries it
  // across exec: a program started by a large parent (a Python benchmark driver) would report the parent's peak.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // the value is in kB
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

}  // namespace minidl::train
