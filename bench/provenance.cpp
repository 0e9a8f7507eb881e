#include "bench/provenance.h"

#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <regex>
#include <sstream>
#include <thread>

#include "core/parallel.h"
#include "ops/cpu/simd/isa.h"

namespace minidl::bench {

namespace {

// What `command` printed on stdout, or "" when it failed.
std::string output_of(const std::string& command) {
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return pclose(p) == 0 ? out : "";
}

nlohmann::json or_null(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

nlohmann::json gpus() {
  nlohmann::json out = nlohmann::json::array();
  std::istringstream lines(
      output_of("nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader,nounits"));
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(trim(x));
    if (f.size() == 4)
      out.push_back({{"name", f[0]}, {"driver", f[1]}, {"sm_clock_max_mhz", f[2]}, {"power_limit_w", f[3]}});
  }
  return out;
}

// "Open MPI 4.1.4" from MPI_Get_library_version's "Open MPI v4.1.4, package: ..." (allowed before MPI_Init).
std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "";
  const std::string s(text, size_t(len));
  std::smatch m;
  if (std::regex_search(s, m, std::regex("Open MPI v([0-9.]+)"))) return "Open MPI " + m[1].str();
  return trim(s.substr(0, s.find(',')));
}

// OpenBLAS's own answer, looked up in the loaded libraries (a build with another BLAS has none).
std::string openblas_call(const char* symbol) {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
  return fn ? trim(fn()) : "";
}

}  // namespace

nlohmann::json provenance(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  const std::string git = "git -C '" MINIDL_SOURCE_DIR "' ";
  std::string commit = trim(output_of(git + "rev-parse HEAD"));
  if (!commit.empty() && !trim(output_of(git + "status --porcelain --untracked-files=no")).empty()) commit += "-dirty";
  std::smatch m;
  const std::string config = openblas_call("openblas_get_config");  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  const std::string openblas = std::regex_search(config, m, std::regex("OpenBLAS ([0-9.]+)")) ? m[1].str() : "";
  const std::string topo = output_of("nvidia-smi topo -m");
  return {{"cpu", ops::simd::host_cpu_name()},
          {"isa", ops::simd::isa_name(ops::simd::current_isa())},
          {"cpus", int(std::thread::hardware_concurrency())},
          {"threads", num_threads()},
          {"gpus", gpus()},
          {"interconnect", or_null(trim(topo))},
          {"device_backend", MINIDL_BENCH_DEVICE_BACKEND},
          {"cuda", or_null(MINIDL_BENCH_CUDA_VERSION)},
          {"cublas", or_null(MINIDL_BENCH_CUBLAS_VERSION)},
          {"nccl", or_null(MINIDL_BENCH_NCCL_VERSION)},
          {"open_mpi", or_null(mpi_library())},
          {"openblas", or_null(openblas)},
          {"openblas_core", or_null(openblas_call("openblas_get_corename"))},
          {"commit", or_null(commit)},
          {"command", command},
          {"build", MINIDL_BENCH_BUILD_FLAGS}};
}

std::string provenance_header(const nlohmann::json& p) {
  std::string out;
  for (const auto& [key, value] : p.items()) {
    if (key == "interconnect" && value.is_string()) {
      out += "# interconnect:\n";
      std::istringstream lines(value.get<std::string>());
      for (std::string line; std::getline(lines, line);) out += "#   " + line + "\n";
      continue;
    }
    out += "# " + key + ": " + (value.is_string() ? value.get<std::string>() : value.dump()) + "\n";
  }
  return out;
}

}  // namespace minidl::bench
