// What the device-step and CUDA-graph tests (test_device_step) share: batches of the 17-token vocabulary their
// tiny GPT uses, and a model's weights read back as one vector.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/sampler.h"
#include "nn/gpt.h"

namespace minidl::testing {

// `rows` sequences of 8 tokens; the ids and the targets follow fixed patterns shifted by id_shift and target_shift.
inline data::Batch tiny_batch(int64_t rows, int id_shift, int target_shift) {
  std::vector<int32_t> ids(size_t(rows * 8)), targets(size_t(rows * 8));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t((i * 7 + size_t(id_shift)) % 17), targets[i] = int32_t((i * 5 + size_t(target_shift)) % 17);
  return {Tensor::from_vector(ids, {rows, 8}), Tensor::from_vector(targets, {rows, 8})};
}

// Every parameter, in order, on the host.
inline std::vector<double> weights(nn::GPT& model) {
  std::vector<double> all;
  for (const Tensor& p : model.parameters()) {
    std::vector<double> v = p.detach().to(Device::cpu()).to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace minidl::testing
