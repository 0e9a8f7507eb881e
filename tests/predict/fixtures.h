// What the predictor's tests predict for: the baby GPT-2 and a made-up machine of round numbers.
#pragma once

#include "predict/machine.h"
#include "nn/gpt.h"

namespace minidl::predict::testing {

inline nn::GPTConfig baby() { return nn::GPTConfig{65, 64, 4, 4, 128, 0.0, true}; }

// 1 TFLOP/s, 100 GB/s, every efficiency 1, 4 GPUs per node.
inline Machine toy_machine() {
  Machine m;
  m.name = "toy";
  m.gpus_per_node = 4;
  m.peak_flops_16 = m.peak_flops_32 = 1e12;
  m.mem_bw = 100e9;
  m.mem_capacity = 1e12;
  m.intra = {1e-6, 10e9};
  m.inter = {1e-5, 1e9};
  m.eff = {1, 1, 1};
  return m;
}

}  // namespace minidl::predict::testing
