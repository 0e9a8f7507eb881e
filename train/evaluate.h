// Evaluation and sampling, collective over the data-parallel group: every rank calls them.
//
//   double val = train::evaluate(model, windows, /*batch=*/12, &topology.dp_group());   // the same on every rank
//   auto text = train::sample(model, prompt, 500, /*temperature=*/1.0, seed);            // the same on every rank
#pragma once

#include <cstdint>
#include <vector>

#include "data/sampler.h"
#include "dist/process_group.h"
#include "nn/gpt.h"

namespace minidl::train {

// Mean loss over the given windows (x, y of shape (n, seq)), in eval mode without recording gradients.
// Windows are processed `batch` at a time; the result does not depend on `batch`. With a data-parallel group, the
// ranks take the batches in turn (batch i on rank i mod size) and exchange the per-batch losses, which every rank
// then adds in batch order: the result has the bits one process computes, `size` times faster.
double evaluate(nn::GPT& model, const data::Batch& windows, int64_t batch, dist::ProcessGroup* dp_group = nullptr);

// Generates n tokens after `prompt` by sampling from softmax(logits / temperature) with Philox(seed). Every rank
// that holds the whole model computes the same tokens.
std::vector<int32_t> sample(nn::GPT& model, std::vector<int32_t> prompt, int64_t n, double temperature,
                            uint64_t seed);

}  // namespace minidl::train
