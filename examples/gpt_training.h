// The pieces of a GPT training run shared by examples/train_gpt and bench/gpt_step: one optimizer step,
// deterministic evaluation, text sampling, and the run's measurements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace minidl::train {

struct StepResult {
  double loss = 0;       // mean cross-entropy of the batch
  double grad_norm = 0;  // global L2 norm before clipping
};

// forward + backward + (optional) clipping + AdamW step at learning rate lr, then zero_grad.
// grad_clip <= 0 disables clipping.
StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, double lr,
                      double grad_clip);

// Mean loss over the given windows (x, y of shape (n, seq)), in eval mode without recording gradients.
// Windows are processed `batch` at a time; the result does not depend on `batch`.
double evaluate(nn::GPT& model, const data::Batch& windows, int64_t batch);

// Generates n tokens after `prompt` by sampling from softmax(logits / temperature) with Philox(seed).
std::vector<int32_t> sample(nn::GPT& model, std::vector<int32_t> prompt, int64_t n, double temperature,
                            uint64_t seed);

// Peak resident set size of this process in MiB (/proc/self/status VmHWM).
double peak_rss_mb();

}  // namespace minidl::train
