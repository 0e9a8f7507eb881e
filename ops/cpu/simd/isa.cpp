// MINIDL_CPU_ISA on top of Highway's dynamic dispatch. Every HWY_DYNAMIC_DISPATCH call indexes a per-function
// table with the bit mask held by hwy::GetChosenTarget(); setting that mask to one target before the first call
// (Update) makes every kernel run that target's code. Highway's own first-call initialisation only runs while
// the mask is unset, so it never overrides a choice made here.
#include "ops/cpu/simd/isa.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

namespace minidl::ops::simd {

static constexpr CpuIsa kAllIsas[] = {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kSse4};  // best first

static int64_t hwy_target(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kSse4: return HWY_SSE4;
    case CpuIsa::kAvx2: return HWY_AVX2;
    case CpuIsa::kAvx512: return HWY_AVX3;
  }
  MINIDL_ASSERT(false);
  return 0;
}

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kSse4: return "sse4";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

static bool is_supported(CpuIsa isa) {
  // HWY_TARGETS: what this build compiled (a -march=native build drops the targets below its baseline).
  return (hwy::SupportedTargets() & HWY_TARGETS & hwy_target(isa)) != 0;
}

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kAllIsas)
    if (is_supported(isa)) out.push_back(isa);
  return out;
}

static std::string supported_list() {
  std::string s = "best";
  for (CpuIsa isa : supported_isas()) s += std::string(", ") + isa_name(isa);
  return s;
}

// The ISA set last; written by set_isa only (after MINIDL_CPU_ISA has been applied, so the variable never
// overrides a later choice).
static CpuIsa g_current = CpuIsa::kSse4;

static void apply(CpuIsa isa) {
  MINIDL_CHECK(is_supported(isa), "CPU ISA: this CPU or build does not support ", isa_name(isa),
               "; expected one of: ", supported_list());
  hwy::GetChosenTarget().Update(hwy_target(isa));
  g_current = isa;
}

static void apply(std::string_view name) {
  if (name == "best") {
    std::vector<CpuIsa> isas = supported_isas();
    if (!isas.empty()) return apply(isas.front());
    // Below SSE4 (a pre-2008 CPU): Highway's portable fallback, chosen by its own initialisation.
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return;
  }
  for (CpuIsa isa : kAllIsas)
    if (name == isa_name(isa)) return apply(isa);
  MINIDL_CHECK(false, "CPU ISA: expected one of best, avx512, avx2, sse4 (supported here: ", supported_list(),
               "), got '", name, "'");
}

void set_isa(CpuIsa isa) {
  ensure_isa_selected();
  apply(isa);
}

void set_isa(std::string_view name) {
  ensure_isa_selected();
  apply(name);
}

std::atomic<bool> detail::isa_selected{false};  // constant-initialised: false before any static constructor runs

// A bad MINIDL_CPU_ISA is a usage error of the whole program: say so and exit 2, as programs do for bad flags.
// (An exception here could surface inside a parallel region, where it would only terminate.)
void detail::select_isa_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("MINIDL_CPU_ISA");
    const char* name = env && *env ? env : "best";
    try {
      apply(std::string_view(name));
    } catch (const Error& e) {
      std::fprintf(stderr, "minidl: MINIDL_CPU_ISA=%s: %s\n", name, e.what());
      std::exit(2);
    }
    isa_selected.store(true, std::memory_order_release);
  });
}

// Applied when the program starts, so a bad value stops it before any work.
static const bool g_env_applied = (ensure_isa_selected(), true);

CpuIsa current_isa() {
  ensure_isa_selected();
  return g_current;
}

std::string host_cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model_name, family, model;
  while (std::getline(in, line) && (model_name.empty() || family.empty() || model.empty())) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    const std::string value = start == std::string::npos ? "" : line.substr(start);
    if (key == "model name" && model_name.empty()) model_name = value;
    if (key == "cpu family" && family.empty()) family = value;
    if (key == "model" && model.empty()) model = value;
  }
  std::string name = model_name.empty() ? "unknown CPU" : model_name;
  if (!family.empty() && !model.empty()) name += ", family " + family + " model " + model;
  return name + ", " + std::to_string(std::thread::hardware_concurrency()) + " CPUs";
}

std::string host_cpu_and_kernels() { return host_cpu_name() + "; kernels " + isa_name(current_isa()); }

}  // namespace minidl::ops::simd
