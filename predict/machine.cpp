#include "predict/machine.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace minidl::predict {

namespace {

constexpr double kGB = 1e9, kGiB = double(1ull << 30), kT = 1e12, kUs = 1e-6;

// Latencies: NCCL's own cost model (src/graph/tuning.cc, hwLat for Ring/Simple) charges 3.4 µs per ring step over
// NVLink and 14 µs over the network; PCIe steps are taken as NVLink's (same protocol, the copy engine's latency).
// Bandwidths are one direction per GPU: NVLink's datasheet figures count both directions, IB's is per port
// (one port per GPU in DGX/HGX nodes).
//
// Efficiency per op class on the GPUs, assumptions rather than measurements (no GPU measured them here):
// products 0.7 of the dense peak (large bf16 cuBLAS GEMMs reach 70-80%), attention 0.5 (FlashAttention-2's paper
// reports 50-73% of A100's peak forward, less backward), memory-bound ops 0.8 of HBM bandwidth.
constexpr OpEfficiency kGpuEfficiency{0.7, 0.5, 0.8};

std::vector<Machine> built_in() {
  return {
      // A100 80GB SXM4 datasheet: 312 TFLOP/s bf16 dense, 19.5 FP32, 2039 GB/s HBM2e, 80 GB; NVLink 3 600 GB/s
      // (both directions); DGX A100: one HDR InfiniBand port (200 Gb/s = 25 GB/s) per GPU.
      {"a100-sxm",
       8,
       312 * kT,
       19.5 * kT,
       2039 * kGB,
       80 * kGiB,
       {3.4 * kUs, 300 * kGB},
       {14 * kUs, 25 * kGB},
       kGpuEfficiency,
       "NVIDIA A100 80GB SXM4 datasheet; DGX A100 (8 GPUs, NVLink 600 GB/s, IB HDR 200 Gb/s per GPU)",
       false},
      // H100 SXM5 datasheet: 989 TFLOP/s bf16 dense, 67 FP32, 3350 GB/s HBM3, 80 GB; NVLink 4 900 GB/s (both
      // directions); DGX H100: one NDR port (400 Gb/s = 50 GB/s) per GPU.
      {"h100-sxm",
       8,
       989 * kT,
       67 * kT,
       3350 * kGB,
       80 * kGiB,
       {3.4 * kUs, 450 * kGB},
       {14 * kUs, 50 * kGB},
       kGpuEfficiency,
       "NVIDIA H100 SXM5 datasheet; DGX H100 (8 GPUs, NVLink 900 GB/s, IB NDR 400 Gb/s per GPU)",
       false},
      // H200 SXM datasheet: the H100's compute (989 bf16 dense, 67 FP32), 4.8 TB/s HBM3e, 141 GB; NVLink 900 GB/s;
      // HGX H200 nodes: 400 Gb/s per GPU.
      {"h200-sxm",
       8,
       989 * kT,
       67 * kT,
       4800 * kGB,
       141 * kGB,
       {3.4 * kUs, 450 * kGB},
       {14 * kUs, 50 * kGB},
       kGpuEfficiency,
       "NVIDIA H200 SXM datasheet; HGX H200 (8 GPUs, NVLink 900 GB/s, 400 Gb/s per GPU)",
       false},
      // A100 80GB PCIe datasheet: 312 TFLOP/s bf16 dense, 19.5 FP32, 1935 GB/s, 80 GB; GPUs talk over PCIe 4.0
      // x16 (16 GT/s x 16 lanes = 32 GB/s each way), nodes over 100 Gb/s Ethernet (12.5 GB/s) shared by the 8.
      {"a100-pcie",
       8,
       312 * kT,
       19.5 * kT,
       1935 * kGB,
       80 * kGiB,
       {3.4 * kUs, 32 * kGB},
       {14 * kUs, 12.5 * kGB / 8},
       kGpuEfficiency,
       "NVIDIA A100 80GB PCIe datasheet; PCIe 4.0 x16 between GPUs, one 100 GbE port per node",
       false},
  };
}

double positive(const nlohmann::json& j, const char* key, const std::string& path) {
  MINIDL_CHECK(j.contains(key) && j[key].is_number() && j[key].get<double>() > 0, "load_machine: ", path,
               ": expected a positive number in field '", key, "'");
  return j[key].get<double>();
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kAllToAll: return "all_to_all";
  }
  return "?";
}

void Machine::validate() const {
  MINIDL_CHECK(gpus_per_node >= 1, "machine ", name, ": gpus_per_node must be >= 1, got ", gpus_per_node);
  const std::pair<const char*, double> fields[] = {
      {"peak_flops_16", peak_flops_16}, {"peak_flops_32", peak_flops_32}, {"mem_bw", mem_bw},
      {"mem_capacity", mem_capacity},   {"intra.beta", intra.beta},       {"inter.beta", inter.beta},
      {"eff.gemm", eff.gemm},           {"eff.attention", eff.attention}, {"eff.elementwise", eff.elementwise}};
  for (const auto& [field, value] : fields)
    MINIDL_CHECK(value > 0, "machine ", name, ": ", field, " must be positive, got ", value);
  MINIDL_CHECK(intra.alpha >= 0 && inter.alpha >= 0, "machine ", name, ": latencies must be >= 0, got ", intra.alpha,
               " and ", inter.alpha);
  for (Collective c : kCollectives)
    if (const std::optional<Link>& m = measured[int(c)])
      MINIDL_CHECK(m->alpha >= 0 && m->beta > 0, "machine ", name, ": the ", collective_name(c),
                   " link needs alpha >= 0 and beta > 0, got ", m->alpha, " and ", m->beta);
}

Machine load_machine(const std::string& path) {
  std::ifstream in(path);
  MINIDL_CHECK(in.good(), "load_machine: cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) { throw Error("load_machine: " + path + " is not JSON: " + e.what()); }
  Machine m;
  m.name = j.value("name", std::string("machine"));
  m.gpus_per_node = int(positive(j, "gpus_per_node", path));
  m.peak_flops_16 = positive(j, "peak_flops_16", path);
  m.peak_flops_32 = positive(j, "peak_flops_32", path);
  m.mem_bw = positive(j, "mem_bw", path);
  m.mem_capacity = positive(j, "mem_capacity", path);
  for (auto [key, link] : {std::pair{"intra", &m.intra}, std::pair{"inter", &m.inter}}) {
    MINIDL_CHECK(j.contains(key) && j[key].is_object(), "load_machine: ", path, ": expected an object '", key,
                 "' with alpha and beta");
    link->alpha = j[key].value("alpha", -1.0);
    link->beta = positive(j[key], "beta", path);
  }
  MINIDL_CHECK(j.contains("eff") && j["eff"].is_object(), "load_machine: ", path,
               ": expected an object 'eff' with gemm, attention and elementwise");
  m.eff = {positive(j["eff"], "gemm", path), positive(j["eff"], "attention", path),
           positive(j["eff"], "elementwise", path)};
  if (j.contains("collectives")) {  // measured links by collective (scripts/predict_calibrate.py)
    const nlohmann::json& measured = j["collectives"];
    MINIDL_CHECK(measured.is_object(), "load_machine: ", path,
                 ": expected 'collectives' to be an object of links by collective");
    for (Collective c : kCollectives)
      if (measured.contains(collective_name(c))) {
        const nlohmann::json& link = measured[collective_name(c)];
        MINIDL_CHECK(link.is_object(), "load_machine: ", path, ": expected collectives.", collective_name(c),
                     " to be an object with alpha and beta");
        m.measured[int(c)] = Link{link.value("alpha", -1.0), positive(link, "beta", path)};
      }
  }
  m.source = j.value("source", std::string(path));
  m.cpu = j.value("cpu", false);
  m.validate();
  return m;
}

std::string machine_to_json(const Machine& m) {
  nlohmann::json j = {
      {"name", m.name},
      {"gpus_per_node", m.gpus_per_node},
      {"peak_flops_16", m.peak_flops_16},
      {"peak_flops_32", m.peak_flops_32},
      {"mem_bw", m.mem_bw},
      {"mem_capacity", m.mem_capacity},
      {"intra", {{"alpha", m.intra.alpha}, {"beta", m.intra.beta}}},
      {"inter", {{"alpha", m.inter.alpha}, {"beta", m.inter.beta}}},
      {"eff", {{"gemm", m.eff.gemm}, {"attention", m.eff.attention}, {"elementwise", m.eff.elementwise}}},
      {"source", m.source},
      {"cpu", m.cpu}};
  for (Collective c : kCollectives)
    if (const std::optional<Link>& link = m.measured[int(c)])
      j["collectives"][collective_name(c)] = {{"alpha", link->alpha}, {"beta", link->beta}};
  return j.dump(2);
}

const std::vector<Machine>& machine_presets() {
  static const std::vector<Machine> presets = [] {
    std::vector<Machine> all = built_in();
    std::ifstream host(MINIDL_PREDICT_PRESETS_DIR "/cpu-host.json");
    if (host.good()) all.push_back(load_machine(MINIDL_PREDICT_PRESETS_DIR "/cpu-host.json"));
    return all;
  }();
  return presets;
}

Machine find_machine(const std::string& name) {
  std::ostringstream names;
  for (const Machine& m : machine_presets()) {
    if (m.name == name) return m;
    names << (names.tellp() > 0 ? ", " : "") << m.name;
  }
  throw Error("unknown machine '" + name + "': expected one of " + names.str() +
              (name == "cpu-host" ? " (cpu-host is written by scripts/predict_calibrate.py)" : ""));
}

}  // namespace minidl::predict
