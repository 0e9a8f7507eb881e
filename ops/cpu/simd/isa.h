// Which instruction set the CPU kernels' vector code runs (ops/cpu/simd/): the one place that reads
// MINIDL_CPU_ISA.
//
// The kernels are compiled once per x86-64 target (SSE4, AVX2, AVX-512) by Google Highway and the best target the
// CPU supports is chosen at run time, so one binary runs at full speed on every x86-64. MINIDL_CPU_ISA forces a
// lower one, so a developer on an AVX-512 machine can measure and test the AVX2 path:
//
//   MINIDL_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell build/bin/bench_gpt_step   # OpenBLAS reads its own variable
//
//   for (CpuIsa isa : supported_isas()) { IsaGuard guard(isa); ... }       // tests: every ISA of this machine
//
// Values: best (the default), avx512, avx2, sse4. A MINIDL_CPU_ISA that is not one of these, or names an ISA this
// CPU (or this build) lacks, stops the program at start with exit code 2 and a message naming the values that
// work here; set_isa() with such a value throws minidl::Error with the same message.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

namespace minidl::ops::simd {

enum class CpuIsa { kSse4, kAvx2, kAvx512 };

const char* isa_name(CpuIsa isa);  // "sse4", "avx2", "avx512"

// The ISAs that this CPU supports and this build compiled, best first.
std::vector<CpuIsa> supported_isas();

// The ISA the kernels run now.
CpuIsa current_isa();

// This host's CPU as benchmarks print it beside their figures: the model name, family and model from
// /proc/cpuinfo, and the CPUs online ("AMD EPYC, family 25 model 17, 2 CPUs"; "unknown CPU, 2 CPUs" without it).
std::string host_cpu_name();
// host_cpu_name() and the kernels' ISA, as the benchmarks' device lines print them: "...; kernels avx512".
std::string host_cpu_and_kernels();

// Runs the kernels on `isa` from now on; throws if this CPU or build lacks it.
void set_isa(CpuIsa isa);
// "best" selects supported_isas().front(); otherwise as set_isa(parse_isa(name)).
void set_isa(std::string_view name);

namespace detail {
extern std::atomic<bool> isa_selected;
void select_isa_from_env();
}  // namespace detail

// Applies MINIDL_CPU_ISA once (at program start). Every kernel wrapper calls it, up to ~100,000 times in a small
// GPT step (attention's row updates), so after the first time it is one inlined load.
inline void ensure_isa_selected() {
  if (!detail::isa_selected.load(std::memory_order_acquire)) detail::select_isa_from_env();
}

// Sets an ISA for a scope and restores the previous one.
class IsaGuard {
 public:
  explicit IsaGuard(CpuIsa isa) : previous_(current_isa()) { set_isa(isa); }
  ~IsaGuard() { set_isa(previous_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  CpuIsa previous_;
};

}  // namespace minidl::ops::simd
