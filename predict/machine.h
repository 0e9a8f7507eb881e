// A machine for the scaling predictor: what one GPU (or, for the calibrated CPU host, one single-threaded rank)
// computes and holds, and the links between ranks as α-β costs (a message of S bytes takes α + S/β).
//
//   predict::Machine m = predict::find_machine("h100-sxm");        // a preset (presets.cpp), sources in comments
//   predict::Machine host = predict::load_machine("predict/presets/cpu-host.json");  // scripts/predict_calibrate.py
//
// Units: seconds, bytes, bytes per second, FLOP/s. β is one direction's bandwidth per rank (a datasheet's
// "600 GB/s NVLink" counts both directions: 300 GB/s here). A node holds gpus_per_node ranks; ranks r and r'
// share a node when r / gpus_per_node == r' / gpus_per_node (a launcher fills nodes in rank order).
//
// Efficiency per op class: the fraction of the roofline an op class reaches on this machine. An op's time is
// max(flops / (peak · eff_class), bytes / bandwidth) for products and attention, and bytes / (bandwidth ·
// eff_elementwise) for the memory-bound rest (layer norms, GELU, the loss, AdamW). The GPU presets' factors are
// assumptions named in presets.cpp; the CPU host's are measured by the calibration.
#pragma once

#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace minidl::predict {

struct Link {
  double alpha = 0;  // seconds per message (latency)
  double beta = 0;   // bytes per second, one direction, per rank
};

// The collectives a link is measured for. A calibration that finds them unlike one another (on the CPU host, Open
// MPI's reduce-scatter moves a byte four times slower than its all-reduce; its all-gather, faster) records one
// link each for within a node; the GPU presets leave them empty and every collective uses `intra`, as NCCL's rings
// all move bytes alike.
enum class Collective { kAllReduce, kReduceScatter, kAllGather, kAllToAll };
inline constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduceScatter,
                                              Collective::kAllGather, Collective::kAllToAll};
// "all_reduce", "reduce_scatter", "all_gather", "all_to_all": bench_collectives' --op
const char* collective_name(Collective c);

struct OpEfficiency {
  double gemm = 1;         // matrix products, against peak_flops
  double attention = 1;    // attention's FLOPs (nanoGPT's count, causal not halved), against peak_flops
  double elementwise = 1;  // memory-bound ops, against mem_bw
};

struct Machine {
  std::string name;
  int gpus_per_node = 8;
  double peak_flops_16 = 0;  // dense FLOP/s per GPU for 16-bit products (--amp bf16/fp16)
  double peak_flops_32 = 0;  // dense FLOP/s per GPU for f32 products (no tensor cores)
  double mem_bw = 0;         // bytes/s of device memory
  double mem_capacity = 0;   // bytes per GPU
  Link intra, inter;         // within a node, between nodes
  OpEfficiency eff;
  std::string source;  // where the numbers come from, one line
  // The ranks are CPU processes running minidl's CPU kernels, whose f32 weight gradients are added into .grad() by
  // the GEMM itself (autograd/functions/product_operand.h): what ZeRO's dropped gradients cost depends on it.
  bool cpu = false;
  // Measured links within a node, by collective (Collective as index; absent: intra).
  std::optional<Link> measured[std::size(kCollectives)] = {};

  // The link a collective runs at within a node.
  const Link& intra_for(Collective c) const {
    const std::optional<Link>& m = measured[int(c)];
    return m ? *m : intra;
  }

  double peak_flops(DType amp) const { return amp == DType::f32 ? peak_flops_32 : peak_flops_16; }
  // Throws naming the field unless every quantity is positive.
  void validate() const;
};

// The built-in presets (presets.cpp) and the calibrated host (predict/presets/cpu-host.json, when present).
const std::vector<Machine>& machine_presets();
// A preset by name ("a100-sxm", "h100-sxm", "h200-sxm", "a100-pcie", "cpu-host"); throws listing the names.
Machine find_machine(const std::string& name);
// A machine from a JSON file written by scripts/predict_calibrate.py (the fields of Machine, in SI units).
Machine load_machine(const std::string& path);
std::string machine_to_json(const Machine& m);

}  // namespace minidl::predict
