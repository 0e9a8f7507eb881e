// Where a benchmark's numbers come from, for its --json output ("provenance") and the header of its table ("# "
// lines): the CPU and the ISA the kernels run, CPUs and threads, the GPUs (name, driver, clocks, power limit) and
// their interconnect when nvidia-smi answers, the versions of CUDA, cuBLAS and NCCL this build compiled against
// (read from their headers at configure time), of Open MPI and OpenBLAS as loaded, the commit and the flags.
// bench/provenance.py is its twin for the Python benchmarks: the same keys, found its own way (a test compares
// the two on this machine).
//
//   const nlohmann::json prov = bench::provenance(argc, argv);
//   if (json) out["provenance"] = prov;
//   else std::fputs(bench::provenance_header(prov).c_str(), stdout);
//
// A field that cannot be known here is null (no GPU, no nvidia-smi, no git).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace minidl::bench {

// Keys: cpu, isa, cpus, threads, gpus (list of {name, driver, sm_clock_max_mhz, power_limit_w}), interconnect,
// device_backend ("cuda", "cuda emulator" or "none"), cuda, cublas, nccl, open_mpi, openblas, openblas_core,
// commit ("<sha>" or "<sha>-dirty"), command, build.
nlohmann::json provenance(int argc, char** argv);

// The same as "# key: value" lines (the interconnect's matrix indented below its key).
std::string provenance_header(const nlohmann::json& provenance);

}  // namespace minidl::bench
