// gpu_probe: the GPU check's first step (scripts/gpu-run.sh). In a few seconds it answers "is this a working GPU
// environment?" before any test or benchmark spends the node's time, and records what the later steps ran on:
//
//   gpu_probe                       # versions, the device, one bf16 cuBLASLt GEMM against the CPU, loaded libraries
//   gpu_probe --ceilings            # also the measured ceilings: a bf16 8192^3 GEMM and a 1 GiB device-to-device copy
//   gpu_probe --json probe.json     # the same as one JSON object in a file (written whole, then renamed)
//
// What it checks, in order, each stopping the probe when it fails:
//   cudaDriverGetVersion / cudaRuntimeGetVersion / cudaGetDeviceCount   the runtime starts and sees a device
//   cudaGetDeviceProperties                                               name, compute capability, SMs, memory
//   ops::matmul on bf16 device tensors (cuBLASLt, opened with dlopen)    equals the CPU's product of the same values
//   cudnnGetVersion, ncclGetVersion                                       the other libraries the backend links
// and then lists every CUDA library mapped into the process (/proc/self/maps), so a report names the files that
// were really used, not the ones a search expected.
//
// Exit status: 0 when everything works; 1 when the GEMM is wrong (a kernel or library bug); 69 when the
// environment is broken (no device, a library that cannot be loaded); 2 on bad usage.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/matmul.h"

namespace {

using namespace minidl;

constexpr int kEnvBroken = 69;  // sysexits.h's EX_UNAVAILABLE: what gpu-run.sh tags ENV

// One report, printed as "key: value" lines and collected for the JSON file.
struct Report {
  std::vector<std::pair<std::string, std::string>> fields;
  void add(const std::string& key, const std::string& value) {
    std::printf("%-22s %s\n", (key + ":").c_str(), value.c_str());
    std::fflush(stdout);
    fields.emplace_back(key, value);
  }
  std::string json() const {
    std::string out = "{";
    for (size_t i = 0; i < fields.size(); ++i) {
      out += (i ? ", \"" : "\"") + fields[i].first + "\": \"";
      for (char c : fields[i].second) {
        if (c == '"' || c == '\\') out += '\\';
        out += c == '\n' ? ' ' : c;
      }
      out += '"';
    }
    return out + "}\n";
  }
};

std::string version_text(int v) {  // CUDA's 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The CUDA libraries this process has mapped, by the files' real paths.
std::vector<std::string> loaded_cuda_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> seen;
  std::string line;
  const char* kNames[] = {"libcuda.so", "libcudart.so", "libcublas.so", "libcublasLt.so",          "libcudnn",
                          "libnccl.so", "libnvrtc",     "libnvJitLink", "libnvidia-ptxjitcompiler"};
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    for (const char* n : kNames)
      if (base.rfind(n, 0) == 0) seen.insert(path);
  }
  return {seen.begin(), seen.end()};
}

// A bf16 product on the device (ops::matmul -> cuBLASLt) against the CPU's product of the same bf16 values in
// f32: the largest difference relative to the largest reference value.
double gemm_relative_error(int64_t n) {
  const Tensor a = Tensor::randn({n, n}, Philox(1), DType::bf16), b = Tensor::randn({n, n}, Philox(2), DType::bf16);
  const Tensor want = ops::matmul(a.to(DType::f32), b.to(DType::f32));
  const Tensor got = ops::matmul(a.to(Device::cuda(0)), b.to(Device::cuda(0))).to(Device::cpu()).to(DType::f32);
  const std::vector<double> w = want.to_vector(), g = got.to_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    worst = std::max(worst, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  return worst / scale;
}

// Seconds per call of fn, the median of `reps` timed calls after one untimed, each fenced by cudaDeviceSynchronize.
template <class Fn>
double seconds_per_call(Fn&& fn, int reps) {
  fn();
  MINIDL_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize failed");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    MINIDL_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize failed");
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void measure_ceilings(Report& r) {
  const int64_t n = 8192;
  const Tensor a = Tensor::randn({n, n}, Philox(3), DType::bf16).to(Device::cuda(0));
  const Tensor b = Tensor::randn({n, n}, Philox(4), DType::bf16).to(Device::cuda(0));
  const double gemm_s = seconds_per_call([&] { (void)ops::matmul(a, b); }, 10);
  r.add("gemm_bf16_8192_tflops", fixed(2.0 * double(n) * n * n / gemm_s / 1e12, 1));
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  MINIDL_CHECK(cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess,
               "cudaMalloc of 2 x 1 GiB for the copy failed");
  const double copy_s =
      seconds_per_call([&] { (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr); }, 10);
  cudaFree(src);
  cudaFree(dst);
  // A copy reads and writes each byte: the bandwidth counts both, as the HBM datasheet figure does.
  r.add("copy_d2d_gbps", fixed(2.0 * double(bytes) / copy_s / 1e9, 0));
}

int probe(bool ceilings, Report& r) {
  int driver = 0, runtime = 0, devices = 0;
  const cudaError_t driver_status = cudaDriverGetVersion(&driver);
  r.add("cuda_driver", driver_status == cudaSuccess && driver > 0 ? version_text(driver) : "none");
  cudaRuntimeGetVersion(&runtime);
  r.add("cuda_runtime", version_text(runtime));
  const cudaError_t count_status = cudaGetDeviceCount(&devices);
  if (count_status != cudaSuccess || devices == 0) {
    r.add("environment", std::string("BROKEN (no CUDA device: cudaGetDeviceCount: ") +
                             (count_status == cudaSuccess ? "0 devices"
                                                          : std::string(cudaGetErrorName(count_status)) + ": " +
                                                                cudaGetErrorString(count_status)) +
                             ")");
    return kEnvBroken;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  r.add("devices", std::to_string(devices));
  r.add("device", p.name);
  r.add("compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor));
  r.add("sms", std::to_string(p.multiProcessorCount));
  r.add("memory_gib", fixed(double(p.totalGlobalMem) / (1 << 30), 1));
  r.add("l2_mib", fixed(double(p.l2CacheSize) / (1 << 20), 1));
  r.add("memory_bus_bits", std::to_string(p.memoryBusWidth));
  r.add("shared_per_block_optin_kib", std::to_string(p.sharedMemPerBlockOptin / 1024));
  try {
    const double err = gemm_relative_error(512);
    r.add("gemm_bf16_512_rel_error", fixed(err, 6));
    if (!(err < 1e-2)) {
      r.add("environment", "OK (but the bf16 GEMM differs from the CPU's)");
      return 1;
    }
  } catch (const Error& e) {
    r.add("environment", std::string("BROKEN (the bf16 GEMM could not run: ") + e.what() + ")");
    return kEnvBroken;
  }
  r.add("cudnn", std::to_string(cudnnGetVersion()));
  int nccl = 0;
  ncclGetVersion(&nccl);
  r.add("nccl",
        std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100));
  if (ceilings) measure_ceilings(r);
  r.add("environment", "OK");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool ceilings = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ceilings") {
      ceilings = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: gpu_probe [--ceilings] [--json FILE]\n");
      return 0;
    } else {
      std::fprintf(stderr, "gpu_probe: unknown argument '%s' (expected --ceilings, --json FILE or --help)\n",
                   a.c_str());
      return 2;
    }
  }
  Report r;
  int rc = 0;
  try {
    rc = probe(ceilings, r);
  } catch (const std::exception& e) {
    r.add("environment", std::string("BROKEN (") + e.what() + ")");
    rc = kEnvBroken;
  }
  std::string libs;
  for (const std::string& path : loaded_cuda_libraries()) libs += (libs.empty() ? "" : " ") + path;
  r.add("loaded_libraries", libs.empty() ? "none" : libs);
  if (!json_path.empty()) {
    const std::string part = json_path + ".part";
    std::ofstream(part) << r.json();
    std::rename(part.c_str(), json_path.c_str());
  }
  return rc;
}
