// Evaluation and sampling. Evaluation is collective over the stage's pp and dp groups: every rank calls it.
//
//   double val = train::evaluate(stage, windows, /*batch=*/12, &topology.dp_group());   // the same on every rank
//   std::vector<int32_t> ids = train::generate(model, prompt, {.max_new_tokens = 500});   // prompt + 500 tokens
#pragma once

#include <cstdint>
#include <vector>

#include "data/sampler.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "train/stage.h"

namespace minidl::train {

// Mean loss over the given windows (x, y of shape (n, seq)), in eval mode without recording gradients.
// Windows are processed `batch` at a time: another `batch` groups the sum differently, so its last bits may differ.
// Each batch flows through the stage's chunks in global order (sent on between pipeline stages). With a data-parallel
// group, the ranks take the batches in turn (batch i on rank i mod size); the per-batch loss sums (on the rank that
// computed them, zeros elsewhere: exact) are summed over the pp and dp groups, and every rank adds them in batch order:
// the result has the bits one process computes.
double evaluate(Stage& stage, const data::Batch& windows, int64_t batch, dist::ProcessGroup* dp_group = nullptr);

// How generate() picks each next token.
struct GenerateOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // softmax(logits / temperature); 0: the most likely token (greedy)
  int64_t top_k = 0;         // > 0: only the k most likely tokens can be drawn (ties at the k-th all stay)
  uint64_t seed = 0;         // token i is drawn with Philox(seed)'s i-th uniform
  // Keep each block's keys and values (nn::KVCache; on tensor-parallel ranks, which generate together, each its
  // own heads'): a new token costs one position, not the window. Where the model cannot keep them
  // (supports_kv_cache(): a sequence-parallel split) the window is recomputed instead. Either way the same tokens:
  // the cache changes only the order of the attention's sums.
  bool kv_cache = true;
};

// `prompt` (at least one token) followed by max_new_tokens generated ones. The context is the last block_size
// tokens: once the window is full it slides, and positions restart (GPT-2's absolute positions), so the cache is
// refilled from the window at each token from then on. Every rank that holds the whole model computes the same
// tokens.
std::vector<int32_t> generate(nn::GPT& model, std::vector<int32_t> prompt, const GenerateOptions& options);

}  // namespace minidl::train
